"""The cellar: the shared foundations every app builds on, below the apps and above ``llm``/``egress``/``runtime``.

The DomainError family and its one HTTP map (errors.py, api.py), request parsing, rendering and filtering (parsers.py,
renderers.py, filters.py, numbers.py), typed documents in the admin and the schema (documents.py, schema.py), outages
and conflicts (outages.py, conflicts.py), live publishing (live.py, redis_layer.py, channel_layers.py, fastjson.py),
the write batch (batch.py), rate-limit buckets (buckets.py), the Redis cache (cache.py), periodic-job locks
(joblock.py), waits on a tenant's server (remote_waits.py), the login lockout (login_lockout.py) and the ASGI
middleware the roof stacks (admission.py, body_limit.py, stream_thread.py).

A plain package, not a Django app: it registers no models, commands or checks. It imports no app and nothing of
``config`` (the roof, which composes the apps and these parts: ``.importlinter``); settings are read through
``django.conf.settings``.
"""
