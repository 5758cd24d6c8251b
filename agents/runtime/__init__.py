"""The pure runtime core: no Django, Celery or Channels import anywhere below here.

The Django layer drives it through the protocols in :mod:`agents.runtime.protocols`.
"""
