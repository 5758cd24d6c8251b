"""One settings module, driven by the environment. No dev/prod forks.

Embedded mode (no ``REDIS_URL``): SQLite, an in-process Celery worker on an in-memory
broker, the embedded channel layer. Production: ``DATABASE_URL`` (PostgreSQL),
``REDIS_URL`` (Celery broker, channel layer, shared rate limits), separate workers.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from csp.constants import NONCE, NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from config.env import (
    env_bool,
    env_choice,
    env_count_or_off,
    env_database,
    env_float,
    env_header,
    env_int,
    env_json_object,
    env_key,
    env_list,
    env_port,
    env_prefixed,
    env_rate,
    env_redis,
    env_str,
    secret_key,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("AGENTOPS_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = secret_key("SECRET_KEY", debug=DEBUG, local_file=VAR_DIR / "secret_key")
#: The audit chains' HMAC key (audit/chain.py). Never stored in the database: whoever can write the database but not
#: read this cannot rewrite a sealed row. Default: derived from SECRET_KEY (a separate value is better).
AUDIT_HMAC_KEY = env_key("AUDIT_HMAC_KEY")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

REDIS_URL = env_redis("REDIS_URL")
EMBEDDED = REDIS_URL is None

DATABASES = {"default": env_database("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A worker thread writes while the server reads: WAL, and writers take the lock up front.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    # A file (not memory), so the live-stack test processes share it; one per test process, so parallel runs don't collide.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-db-{os.getpid()}.sqlite3")}
else:
    # PostgreSQL: every process (each server process, each Celery worker) borrows connections from one bounded pool
    # (Django's psycopg_pool integration) and returns them when a request or task ends, so a process never holds
    # more than DB_POOL_MAX_SIZE and none is opened per request or per task. The sizing rule is in the README:
    # server processes x DB_POOL_MAX_SIZE + worker processes x DB_POOL_MAX_SIZE <= max_connections - reserve.
    # A request that cannot get a connection within DB_POOL_TIMEOUT seconds (or finds DB_POOL_MAX_WAITING requests
    # already queued) is answered 503 with Retry-After (core/outages.py), never a database error.
    # Django's pool needs CONN_MAX_AGE=0: "closing" a connection returns it to the pool.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True  # with the pool: each connection is checked as it is lent out
    # Parameters are bound by the server (psycopg's own cursor, not Django's default of quoting them into the SQL in
    # Python), so a statement's text is the same on every execution and PostgreSQL can keep it parsed and planned:
    # psycopg prepares a statement on a connection once it ran DB_PREPARE_THRESHOLD times there (issue #14: the hot
    # path's lock, policy read and step writes are planned once per pooled connection, not once per execution).
    # "off" for a pooler in transaction mode without prepared-statement support (PgBouncer < 1.21).
    DB_PREPARE_THRESHOLD = env_count_or_off("DB_PREPARE_THRESHOLD", 5)
    DATABASES["default"].setdefault("OPTIONS", {}).update(server_side_binding=True,
                                                          prepare_threshold=DB_PREPARE_THRESHOLD)
    # A statement, or a wait for a lock, past its bound is cut by PostgreSQL and the request answered 503 with
    # Retry-After (core/outages.py) instead of holding its pooled connection for as long as the lock is held.
    # Requests are short; worker tasks get the WORKER_ bounds (config/celery.py sets them on a worker's connections).
    # 0: no bound.
    DB_STATEMENT_TIMEOUT_SECONDS = env_float("DB_STATEMENT_TIMEOUT_SECONDS", 15.0, minimum=0.0)
    DB_LOCK_TIMEOUT_SECONDS = env_float("DB_LOCK_TIMEOUT_SECONDS", 5.0, minimum=0.0)
    WORKER_DB_STATEMENT_TIMEOUT_SECONDS = env_float("WORKER_DB_STATEMENT_TIMEOUT_SECONDS", 120.0, minimum=0.0)
    WORKER_DB_LOCK_TIMEOUT_SECONDS = env_float("WORKER_DB_LOCK_TIMEOUT_SECONDS", 30.0, minimum=0.0)
    DATABASES["default"].setdefault("OPTIONS", {})["options"] = (
        f"-c statement_timeout={round(DB_STATEMENT_TIMEOUT_SECONDS * 1000)} -c lock_timeout={round(DB_LOCK_TIMEOUT_SECONDS * 1000)}")
    DB_POOL_MAX_SIZE = env_int("DB_POOL_MAX_SIZE", 10, minimum=0)  # 0: no pool, a connection per request (not advised)
    if DB_POOL_MAX_SIZE:
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": min(env_int("DB_POOL_MIN_SIZE", 2, minimum=0), DB_POOL_MAX_SIZE),
            "max_size": DB_POOL_MAX_SIZE,
            "timeout": env_float("DB_POOL_TIMEOUT", 3.0, minimum=0.1),
            "max_waiting": env_int("DB_POOL_MAX_WAITING", 50, minimum=0),  # 0: no limit on queued requests
            "max_idle": 300.0,  # an idle connection beyond min_size is closed after 5 minutes
            "max_lifetime": 1800.0,  # every connection is replaced after 30 minutes (with jitter)
            "name": "agentops",
        }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django_prometheus",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "guardian",
    "axes",  # login lockout (core/login_lockout.py)
    "channels",
    # The roof (config/apps.py): the deployment checks and the PostgreSQL timestamp loader, wired before any app's
    # ready() runs; and `manage.py serve`. Our apps follow, none of which imports it.
    "config",
    "tenants",
    "agents",
    "tools",
    "approvals",
    "flows",
    "releases",
    "marketplace",
    "audit",
    "accounts",
    "console",  # the operators' dashboard: run list, live trace, spend
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",  # one Content-Security-Policy for every page (django-csp as shipped)
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "core.outages.OutageMiddleware",  # a view failing on a database or Redis outage answers 503 + Retry-After
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
    "axes.middleware.AxesMiddleware",  # innermost: turns a locked-out login into the lockout page (429)
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.playground.context",
            ],
        },
    },
]

AUTHENTICATION_BACKENDS = [
    "core.login_lockout.LoginLockoutBackend",  # first: refuses locked-out logins before any password check
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
# Django's default hashers unless the environment names others: the test suite names a fast one (tests/conftest.py),
# since PBKDF2 costs about a second a hash on a 2-core machine and the suite makes thousands of users.
PASSWORD_HASHERS = env_list("PASSWORD_HASHERS", [
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2SHA1PasswordHasher",
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.BCryptSHA256PasswordHasher",
    "django.contrib.auth.hashers.ScryptPasswordHasher",
])
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"  # the console's session login (templates/registration/login.html)
LOGIN_REDIRECT_URL = "/console/runs/"  # after login, the run list

# Brute-force limit on both login pages (django-axes; the policy is explained in core/login_lockout.py):
# a username is locked out from one address after AXES_FAILURE_LIMIT failures, for AXES_COOLOFF_MINUTES.
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 10, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("AXES_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "core.login_lockout.lockout_response"
AXES_CLIENT_IP_CALLABLE = "core.login_lockout.client_ip"
#: Behind a trusted reverse proxy only: the header carrying the client's address (e.g. X-Forwarded-For, X-Real-IP).
CLIENT_IP_HEADER = env_header("CLIENT_IP_HEADER")

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns about a missing root even when it serves from finders
WHITENOISE_USE_FINDERS = True  # serve straight from the apps' static folders: no build or collect step needed

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
#: Served over TLS (the default when DEBUG is off): http redirects to https, cookies are secure, HSTS is sent.
#: HTTPS_ONLY=false only for plain http on a trusted network, such as the test suite on 127.0.0.1.
HTTPS_ONLY = env_bool("HTTPS_ONLY", not DEBUG)
if HTTPS_ONLY:
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]  # probes and the scraper, inside the network
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
#: Behind a TLS-terminating proxy: the header it sets to "https" (e.g. X-Forwarded-Proto). Trust it only if the
#: proxy always sets (or strips) it; unset = the connection itself says whether it is TLS.
_proxy_ssl_header = env_str("SECURE_PROXY_SSL_HEADER", "")
if _proxy_ssl_header:
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https")

# One Content-Security-Policy for every page (django-csp): scripts and styles from our static files, or inline
# only with the response's nonce (the API docs' style block); no inline event handlers, no eval, no framing.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, NONCE],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "font-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "frame-ancestors": [NONE],
        "form-action": [SELF],
    },
}

# --- Metrics ------------------------------------------------------------------------------
#: When set, ``/metrics`` answers only ``Authorization: Bearer <METRICS_TOKEN>`` (401 otherwise). Unset: open, and
#: ``check --deploy`` warns (agentops.W001).
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
# Production: the server and the separate Celery workers write prometheus_client multiprocess files to one
# directory and /metrics aggregates them (agents/metrics.py explains). Set before prometheus_client is imported.
# --- Tracing (OpenTelemetry; the SDK reads its other OTEL_* variables itself, e.g. the sampler) ---
#: Spans of every run step go to this OTLP/HTTP endpoint; empty: tracing is off.
OTEL_EXPORTER_OTLP_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
OTEL_SDK_DISABLED = env_bool("OTEL_SDK_DISABLED", False)

PROMETHEUS_MULTIPROC_DIR = env_str("PROMETHEUS_MULTIPROC_DIR", "" if EMBEDDED else str(VAR_DIR / "prometheus"))
if PROMETHEUS_MULTIPROC_DIR:
    Path(PROMETHEUS_MULTIPROC_DIR).mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = PROMETHEUS_MULTIPROC_DIR

# --- API ----------------------------------------------------------------------------------
#: The largest request body (bytes) any endpoint accepts; larger is a 413 at the ASGI edge (core/body_limit.py) and in Django.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("MAX_REQUEST_BODY_BYTES", 2_621_440, minimum=65_536)

#: Seconds a server process may reuse an API key it looked up (tenants/keycache.py), as long as nothing deciding any
#: key's access changed meanwhile (checked on every request through a stamp in Redis). Off (0) in embedded mode, whose
#: cache is process memory another process cannot reach.
API_KEY_CACHE_SECONDS = env_int("API_KEY_CACHE_SECONDS", 0 if EMBEDDED else 30, minimum=0)
if EMBEDDED and API_KEY_CACHE_SECONDS:
    raise ImproperlyConfigured("API_KEY_CACHE_SECONDS needs REDIS_URL: its invalidation stamp must reach every process.")

REST_FRAMEWORK = {
    # Bodies bounded in size (DATA_UPLOAD_MAX_MEMORY_SIZE), JSON also in nesting depth (core/parsers.py).
    "DEFAULT_PARSER_CLASSES": ["core.parsers.JSONParser", "core.parsers.FormParser", "core.parsers.MultiPartParser"],
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.auth.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "core.api.exception_handler",
    "DEFAULT_RENDERER_CLASSES": [
        "core.renderers.FastJSONRenderer",  # orjson; the same document as DRF's JSONRenderer (core/renderers.py)
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # Per API key (or session user), never per address only; run creation has its own budget (tenants/throttles.py).
    "DEFAULT_THROTTLE_CLASSES": ["tenants.throttles.CallerThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "api": env_rate("API_THROTTLE_RATE", "1200/min"),
        "run_create": env_rate("RUN_CREATE_THROTTLE_RATE", "300/min"),
    },
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Agent Operations Console API",
    "DESCRIPTION": "Start runs, read their traces, manage agents. Authenticate with `Authorization: Bearer <api key>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Every operation documents the errors the API answers with (400, 401, 403, 404, 413, 415, 429) and their body.
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "core.schema.document_error_responses"],
    # Runs and a session's runs share one status enum, named here (several components have a field "status").
    "ENUM_NAME_OVERRIDES": {"RunStatusEnum": "agents.models.RunStatus", "ReplayModelModeEnum": "releases.models.ModelMode"},
}

# --- Channels -----------------------------------------------------------------------------
#: Seconds a Redis read may wait (channel layer, Celery broker). Must outlast the channel layer's 5 s blocking read.
REDIS_SOCKET_TIMEOUT = env_int("REDIS_SOCKET_TIMEOUT", 30, minimum=10)
#: Seconds to establish a Redis connection before giving up (then the caller retries or reports the outage).
REDIS_CONNECT_TIMEOUT = env_int("REDIS_CONNECT_TIMEOUT", 5, minimum=1)
#: Every open websocket gets ``{"type": "heartbeat"}`` this often (0 = off); clients use it to detect a dead connection.
WS_HEARTBEAT_SECONDS = env_int("WS_HEARTBEAT_SECONDS", 20, minimum=0)
#: A worker reuses whether anyone watches a run (its trace, the tenant's run list) for up to this many seconds instead
#: of asking at every step (core/redis_layer.py); a new watcher's join is announced to every worker, which then asks
#: again at once. Watchers also read the database once this long after they joined (for a lost announcement). 0: ask
#: at every step, no second read.
LIVE_MEMBERS_TTL_SECONDS = env_float("LIVE_MEMBERS_TTL_SECONDS", 1.0, minimum=0.0)
#: A websocket's channel-layer membership (a watched run's feed, a tenant's run list or approvals) is renewed every third
#: of this many seconds while it lives; one not renewed for this long (a killed server process's) is dropped at the
#: next send, instead of every step sending to it for channels_redis's default of a day.
LIVE_GROUP_EXPIRY_SECONDS = env_int("LIVE_GROUP_EXPIRY_SECONDS", 300, minimum=30)
if LIVE_MEMBERS_TTL_SECONDS > 10:
    raise ImproperlyConfigured(f"LIVE_MEMBERS_TTL_SECONDS must be at most 10 (a new watcher may wait that long for the "
                               f"events sent just before it joined), got {LIVE_MEMBERS_TTL_SECONDS}.")
if EMBEDDED:
    CHANNEL_LAYERS = {"default": {"BACKEND": "core.channel_layers.EmbeddedChannelLayer", "CONFIG": {"capacity": 1000}}}
else:
    # redis-py times out socket reads after 5 s by default — exactly the channel layer's blocking read (BZPOPMIN,
    # 5 s), so an idle consumer's read raised TimeoutError and its socket was dropped every 5 s. The layer's
    # connections wait longer than its own blocking read; keepalive and health checks still catch dead peers.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",  # as shipped; its public group_send (core/live.py)
            "CONFIG": {
                "hosts": [{
                    "address": REDIS_URL,
                    "socket_timeout": REDIS_SOCKET_TIMEOUT,
                    "socket_connect_timeout": REDIS_CONNECT_TIMEOUT,
                    "socket_keepalive": True,
                    "health_check_interval": 30,
                }],
                "capacity": 1000,
                "expiry": 60,
                "group_expiry": LIVE_GROUP_EXPIRY_SECONDS,
                "prefix": "agentops",
            },
        }
    }
#: Who watches which live group, in keys of our own beside the channel layer's (core/redis_layer.py): a step nobody
#: watches is neither framed nor sent. None (embedded mode): every step is sent, which costs no round trip there.
LIVE_WATCHED: dict[str, object] | None = None if EMBEDDED else {
    "url": REDIS_URL, "prefix": "agentops", "ttl": LIVE_MEMBERS_TTL_SECONDS, "expiry": LIVE_GROUP_EXPIRY_SECONDS,
    "socket_timeout": REDIS_CONNECT_TIMEOUT, "socket_connect_timeout": REDIS_CONNECT_TIMEOUT,
}

# --- Cache (API rate-limit counters, periodic-job locks) -----------------------------------
if EMBEDDED:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "agentops"}}
else:
    # Shared by every server process (the API key cache's access stamp, periodic-job locks). django-redis: one redis-py
    # client per server, reused by every call, where Django's own backend builds one per call (about 0.13 ms of CPU
    # each, docs/decisions/cache-backend.md); keys and values read and written as Django's own backend does.
    CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "agentops",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": REDIS_CONNECT_TIMEOUT, "SOCKET_TIMEOUT": REDIS_CONNECT_TIMEOUT},
        }
    }

# --- Celery -------------------------------------------------------------------------------
CELERY_BROKER_URL = REDIS_URL or "memory://localhost/"  # a host named: kombu warns at start without one
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = env_int("RUN_TASK_TIME_LIMIT", 900, minimum=10)
CELERY_TASK_SOFT_TIME_LIMIT = CELERY_TASK_TIME_LIMIT - 30 if CELERY_TASK_TIME_LIMIT > 60 else CELERY_TASK_TIME_LIMIT
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# An unacknowledged task (its worker died) is redelivered after this many seconds.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("BROKER_VISIBILITY_TIMEOUT", 1800, minimum=30)}
if not EMBEDDED:
    # Kombu's blocking read (BRPOP) waits 1 s, well inside the socket timeout; a dead broker is noticed on connect.
    CELERY_BROKER_TRANSPORT_OPTIONS.update(socket_timeout=REDIS_SOCKET_TIMEOUT, socket_connect_timeout=REDIS_CONNECT_TIMEOUT,
                                           socket_keepalive=True, health_check_interval=30)
if EMBEDDED:
    CELERY_BROKER_TRANSPORT_OPTIONS["polling_interval"] = 0.05  # the in-memory queue is polled; keep runs snappy
#: The queue runs go through; separate deployments (or test stacks) sharing one Redis use separate queues.
CELERY_TASK_DEFAULT_QUEUE = env_str("AGENTOPS_QUEUE", "agentops")

# --- Runs ---------------------------------------------------------------------------------
#: How long a worker's lease on a run lasts without a step commit before another may take it.
RUN_LEASE_SECONDS = env_int("RUN_LEASE_SECONDS", 120, minimum=5)
#: A tenant's bound on running work (agents/capacity.py): at most this many of its agent runs being executed and flow
#: nodes running at once, unless the tenant's own max_running says otherwise. Below a worker's 4 slots (Makefile), so
#: one tenant alone never fills a worker. Over it, a run's task is parked: back on the queue in TENANT_PARK_SECONDS
#: (doubling each time it is parked again, up to TENANT_PARK_MAX_SECONDS).
if os.environ.get("FLOW_TENANT_MAX_NODES") is not None:
    raise ImproperlyConfigured("FLOW_TENANT_MAX_NODES is replaced by TENANT_MAX_RUNNING (agent runs and flow nodes).")
TENANT_MAX_RUNNING = env_int("TENANT_MAX_RUNNING", 3, minimum=1)
TENANT_PARK_SECONDS = env_float("TENANT_PARK_SECONDS", 0.5, minimum=0.05)
#: A run parked again comes back after twice as long each time, up to this.
TENANT_PARK_MAX_SECONDS = env_float("TENANT_PARK_MAX_SECONDS", 4.0, minimum=TENANT_PARK_SECONDS)
#: Flows (flows/runner.py): a running node's lease outlives its timeout_seconds by FLOW_NODE_LEASE_GRACE_SECONDS
#: before it counts as dead.
FLOW_NODE_LEASE_GRACE_SECONDS = env_int("FLOW_NODE_LEASE_GRACE_SECONDS", 30, minimum=1)
#: A step commit, flow completion or flow decision that lost a deadlock or serialization failure is run again at most
#: this many times (core/conflicts.py) before the error counts.
DB_CONFLICT_RETRIES = env_int("DB_CONFLICT_RETRIES", 5, minimum=0)
#: Runs longer than this in input are refused at the API.
RUN_INPUT_MAX_CHARS = env_int("RUN_INPUT_MAX_CHARS", 20_000, minimum=100)

# --- Run sweeper (agents/sweeper.py) -------------------------------------------------------
# Re-enqueues runs whose worker died (status running, lease expired) and runs whose enqueue was
# lost (queued, no lease, older than SWEEP_QUEUED_AFTER_SECONDS). Production: run
# `celery -A config beat` (one process per deployment) next to the workers, or `manage.py
# sweep_runs` from cron. Embedded mode: a thread in the server process does it (config/embedded.py).
SWEEP_INTERVAL_SECONDS = env_int("SWEEP_INTERVAL_SECONDS", 10, minimum=1)
#: A queued run with no lease this old is assumed lost by the broker and enqueued again; a run is
#: re-enqueued at most once per this many seconds (duplicates are harmless: the lease decides).
SWEEP_QUEUED_AFTER_SECONDS = env_int("SWEEP_QUEUED_AFTER_SECONDS", 60, minimum=1)
#: How many Celery workers consume this deployment's queue: /healthz is degraded (200, "workers" down) with fewer.
WORKERS_EXPECTED = env_int("WORKERS_EXPECTED", 1, minimum=1)
#: A notification delivery still pending (or overdue for its retry) this long is taken as lost with its task and sent
#: again by the approval-expiry sweep, with the same X-AgentOps-Delivery id (receivers dedupe on it: at least once).
NOTIFY_RESEND_AFTER_SECONDS = env_int("NOTIFY_RESEND_AFTER_SECONDS", 120, minimum=5)
#: A replay shard's lease: renewed after each replayed run, so a shard whose worker died is taken over by the replay
#: sweeper this many seconds (plus one sweep interval) after its last run, not after the broker's visibility timeout.
REPLAY_LEASE_SECONDS = env_int("REPLAY_LEASE_SECONDS", 60, minimum=5)
CELERY_BEAT_SCHEDULE = {
    # Overdue approval requests expire; their runs go on with "approval expired" (approvals/decisions.py).
    "expire-approvals": {"task": "tools.expire_approvals", "schedule": 15.0, "options": {"expires": 15.0}},
    "sweep-runs": {
        "task": "agents.sweep_runs",
        "schedule": float(SWEEP_INTERVAL_SECONDS),
        # A sweep that waited longer than one interval in the queue is stale: the next one is due.
        "options": {"expires": float(SWEEP_INTERVAL_SECONDS)},
    },
    # Replay shards whose worker died or whose message was lost are enqueued again (releases/sweeper.py).
    "sweep-replays": {
        "task": "releases.sweep_replays",
        "schedule": float(SWEEP_INTERVAL_SECONDS),
        "options": {"expires": float(SWEEP_INTERVAL_SECONDS)},
    },
    # Gray release: roll back candidate agent versions whose guard tripped (marketplace/services.py).
    "check-release-guards": {
        "task": "marketplace.tasks.check_release_guards_task",
        "schedule": 30.0,
        "options": {"expires": 30.0},
    },
}

# --- Site-specific tools ---------------------------------------------------------------------
#: Python modules (comma-separated, importable from the server's and workers' path) that register
#: extra tools with ``@tools.pyfunc.tool`` at start-up, e.g. ``acme_tools.crm,acme_tools.billing``.
#: Install them for a tenant afterwards (admin or ``tools.services.install_python_tool``).
AGENTOPS_EXTRA_TOOL_MODULES = env_list("AGENTOPS_EXTRA_TOOL_MODULES", [])

# --- Hook and interceptor extensions (runtime/plugins.py) ----------------------------
#: Which hook/interceptor kinds installed packages contribute (entry-point groups agentops.hooks,
#: agentops.model_interceptors, agentops.tool_interceptors) versions may name: kinds or patterns,
#: comma-separated, e.g. "acme.redact_pii,acme.*". Default "*": every installed one; empty: none.
#: Built-in kinds are always allowed. `manage.py list_extensions` shows the table.
AGENTOPS_ALLOWED_EXTENSIONS = env_list("AGENTOPS_ALLOWED_EXTENSIONS", ["*"])

# --- Tools ------------------------------------------------------------------------------
#: Hosts and CIDRs tools may reach although they are private (e.g. "10.0.4.0/24,billing.internal").
TOOL_EGRESS_ALLOW = env_list("TOOL_EGRESS_ALLOW", [])
#: The same for tenants' model providers (checked at start-up by tools/apps.py, like TOOL_EGRESS_ALLOW).
PROVIDER_EGRESS_ALLOW = env_list("PROVIDER_EGRESS_ALLOW", [])
# --- Deployment secrets and the default model provider: read here, once; no other module reads os.environ ---
#: ``secret:NAME`` in an HTTP tool's headers is TOOL_SECRET_<NAME>; in a provider, PROVIDER_SECRET_<NAME>.
TOOL_SECRETS = env_prefixed("TOOL_SECRET_")
PROVIDER_SECRETS = env_prefixed("PROVIDER_SECRET_")
#: What stored provider keys are encrypted with (SECRET_KEY when unset).
PROVIDER_KEY_SECRET = env_str("PROVIDER_KEY_SECRET", "")
#: The implicit provider ``openai`` (agents/providers.py): its URL, key, default model and model prices (JSON).
OPENAI_BASE_URL = env_str("OPENAI_BASE_URL", "")
OPENAI_API_KEY = env_str("OPENAI_API_KEY", "")
OPENAI_MODEL = env_str("OPENAI_MODEL", "")
OPENAI_MODELS = env_json_object("OPENAI_MODELS")
#: seed_demo's password for admin/operator/approver and the demo tenant's API key (made up and stored when unset).
DEMO_PASSWORD = env_str("DEMO_PASSWORD", "")
DEMO_API_KEY = env_str("DEMO_API_KEY", "")
# --- manage.py serve ---
SERVE_HOST = env_str("HOST", "127.0.0.1")
SERVE_PORT = env_port("PORT", 8000)
#: HTTP requests in progress per server process; the next is answered 503 with Retry-After at once (core/admission.py).
#: 0: no limit. Beyond the pool's DB_POOL_MAX_SIZE, requests only wait for a connection; keep it a small multiple, and
#: below DB_POOL_MAX_SIZE + DB_POOL_MAX_WAITING. It bounds the work queued in a process in time: 48 requests at the
#: few ms of CPU a request costs under load (bench/api_load.py, docs/decisions/server-layout.md) is ≈0.2-0.3 s of
#: work queued; 32 refused momentary bursts at 220 requests/s.
MAX_CONCURRENT_REQUESTS = env_int("MAX_CONCURRENT_REQUESTS", 48, minimum=0)
#: A run's event stream (GET /api/v1/runs/<id>/stream) sends a comment after this many idle seconds (agents/sse.py).
SSE_KEEPALIVE_SECONDS = env_float("SSE_KEEPALIVE_SECONDS", 15.0, minimum=0.1)
#: Streams (a run's SSE stream, its trace websocket) open at once per API key (or signed-in user) and per tenant, across
#: every server process; the next is a 429 with Retry-After (a websocket is closed with 4429). 0: no bound
#: (tenants/open_streams.py). A stream's count is a lease renewed while it lives: a killed process's streams stop
#: counting after OPEN_STREAM_LEASE_SECONDS.
MAX_OPEN_STREAMS_PER_KEY = env_int("MAX_OPEN_STREAMS_PER_KEY", 20, minimum=0)
MAX_OPEN_STREAMS_PER_TENANT = env_int("MAX_OPEN_STREAMS_PER_TENANT", 100, minimum=0)
OPEN_STREAM_LEASE_SECONDS = env_int("OPEN_STREAM_LEASE_SECONDS", 60, minimum=3)
#: Server processes (uvicorn workers) ``manage.py serve`` starts; each has its own database pool (DB_POOL_MAX_SIZE).
#: Embedded mode always serves from one process (its Celery worker lives there).
SERVE_WORKERS = env_int("SERVE_WORKERS", 1, minimum=1)
UVICORN_LOG_LEVEL = env_choice("UVICORN_LOG_LEVEL", "warning", ("critical", "error", "warning", "info", "debug", "trace"))

# --- Approval notifications (approvals/notify.py) ---------------------------------------------------
#: The address people reach the console at; every notification deep-links to ``<PUBLIC_BASE_URL>/approvals/<id>/``.
#: Unset: the first of CSRF_TRUSTED_ORIGINS (the production settings name the public origin there), else this machine.
PUBLIC_BASE_URL = env_str("PUBLIC_BASE_URL", CSRF_TRUSTED_ORIGINS[0] if CSRF_TRUSTED_ORIGINS else f"http://127.0.0.1:{SERVE_PORT}").rstrip("/")
#: How long before a pending request expires its channels get the "expiring" notice (0: none).
APPROVAL_EXPIRY_NOTICE_SECONDS = env_int("APPROVAL_EXPIRY_NOTICE_SECONDS", 300, minimum=0)
#: Attempts per delivery, and the first retry's delay (doubled on each further retry, at most an hour).
NOTIFY_MAX_ATTEMPTS = env_int("NOTIFY_MAX_ATTEMPTS", 5, minimum=1)
NOTIFY_RETRY_BASE_SECONDS = env_float("NOTIFY_RETRY_BASE_SECONDS", 10.0, minimum=0.0)
#: Webhook signing secrets: a channel's ``secret:NAME`` is NOTIFY_SECRET_<NAME>, usable by the tenants a platform
#: administrator granted it to (the tenant's settings ``{"notify_secrets": ["NAME"]}``).
NOTIFY_SECRETS = env_prefixed("NOTIFY_SECRET_")
#: Django's mail backend: the console in embedded mode, SMTP (EMAIL_HOST...) otherwise.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend" if EMBEDDED
                        else "django.core.mail.backends.smtp.EmailBackend")
EMAIL_FILE_PATH = env_str("EMAIL_FILE_PATH", str(VAR_DIR / "mail"))
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_port("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "agentops@localhost")

#: Commands stdio MCP servers may run (whole command lines, ";"-separated): importing tools never runs anything else.
MCP_STDIO_COMMANDS = [c.split() for c in env_str("MCP_STDIO_COMMANDS", "python -m mcp_server_time;mcp-server-time").split(";") if c.strip()]
#: A write tool called again with the same arguments in the same session within this window is blocked.
TOOL_DUPLICATE_WINDOW_SECONDS = env_int("TOOL_DUPLICATE_WINDOW_SECONDS", 600, minimum=0)
#: At most this many calls of one tool (per tenant) run at once in a process (tools/bulkhead.py).
TOOL_BULKHEAD_SIZE = env_int("TOOL_BULKHEAD_SIZE", 4, minimum=1)
#: At most this many of one model turn's tool calls under way at once (runtime AgentConfig.tool_calls_at_once).
TOOL_CALLS_AT_ONCE = env_int("TOOL_CALLS_AT_ONCE", 8, minimum=1)
#: Requests of one tenant waiting on a server it chose (MCP imports, provider tests, webhook DNS) at once, across every server
#: process; the next is a 429 with Retry-After. Such a request holds no database connection meanwhile (core/remote_waits.py).
REMOTE_CALLS_PER_TENANT = env_int("REMOTE_CALLS_PER_TENANT", 2, minimum=1)

# --- Logging ------------------------------------------------------------------------------
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    # Celery's INFO lines about the periodic housekeeping tasks (every few seconds) only at LOG_LEVEL=DEBUG (config/logs.py).
    "filters": {"quiet_housekeeping": {"()": "config.logs.QuietHousekeeping"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["quiet_housekeeping"]}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "INFO"}, "axes": {"level": "WARNING"}},  # axes: failures and lockouts only
}
