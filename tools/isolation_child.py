"""Imported by the fork server of process-isolated tools only (never by the worker): set Django up
once, with the database switched off, so each forked child starts ready (see :mod:`tools.isolation`)."""

from tools.isolation import prepare_child

prepare_child()
