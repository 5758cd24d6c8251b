# Two commands: `make run` (fresh machine: venv, install, migrate, seed, serve) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
export DEBUG ?= true

.PHONY: run test lint unit worker migrate seed clean chromium

$(VENV)/.installed: requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit("Python >= 3.11 is required, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

$(VENV)/.dev-installed: $(VENV)/.installed requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

migrate: $(VENV)/.installed
	$(PY) manage.py migrate --noinput

seed: migrate
	$(PY) manage.py seed_demo

run: seed
	PORT=$(PORT) $(PY) manage.py serve

worker: $(VENV)/.installed
	$(VENV)/bin/celery -A config worker --loglevel=INFO --pool=threads --concurrency=4 -Q $${AGENTOPS_QUEUE:-agentops}

# Production: one beat per deployment; it enqueues agents.sweep_runs every SWEEP_INTERVAL_SECONDS (agents/sweeper.py).
.PHONY: beat
beat: $(VENV)/.installed
	$(VENV)/bin/celery -A config beat --loglevel=INFO -s var/celerybeat-schedule

lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy runtime
	$(VENV)/bin/mypy clients/python/agentops_client
	$(VENV)/bin/lint-imports --no-cache

# The whole suite in the configured mode (DATABASE_URL/REDIS_URL set: PostgreSQL + Redis + a separate
# Celery worker process; unset: the embedded default). tests/unit and tests/db run on TEST_WORKERS pytest-xdist
# workers, each with its own test database and, with REDIS_URL, its own Redis database (the URL's number plus the
# worker's index, tests/conftest.py: the throttle buckets and the key cache are keyed by row ids that each worker's
# database repeats). The live-stack tests (integration, e2e) start servers and workers of their own and run after,
# serially. When it ran on PostgreSQL/Redis, tests/db and the live-stack tests run a second time on the embedded
# default, so both run modes are exercised (but the Redis layer's tests, which ran in the first pass and refuse to
# skip in CI).
TEST_WORKERS ?= auto
TEST_ENV := DEBUG=false HTTPS_ONLY=false SECRET_KEY=test-only-secret-key-0123456789abcdefghij
test: $(VENV)/.dev-installed lint chromium
	$(TEST_ENV) $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup tests/unit $(PYTEST_ARGS)
	$(TEST_ENV) $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup tests/db $(PYTEST_ARGS)
	$(TEST_ENV) $(VENV)/bin/pytest tests/integration tests/e2e $(PYTEST_ARGS)
	@if [ -n "$$REDIS_URL" ]; then \
		echo "== tests/db and the live-stack tests again on the embedded default (SQLite, in-process worker) =="; \
		env -u DATABASE_URL -u REDIS_URL $(TEST_ENV) $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup tests/db \
			--ignore tests/db/test_redis_layer.py $(PYTEST_ARGS) && \
		env -u DATABASE_URL -u REDIS_URL $(TEST_ENV) $(VENV)/bin/pytest tests/integration $(PYTEST_ARGS); \
	fi

# The browser tests (tests/e2e) drive Debian's Chromium through Playwright; never `playwright install`.
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			DEBIAN_FRONTEND=noninteractive apt-get install -y chromium || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; }; \
		else \
			echo "Chromium is missing: run 'sudo apt-get install -y chromium' (browser tests skip locally, fail in CI)."; \
		fi; \
	fi

$(VENV)/.bench-installed: $(VENV)/.dev-installed requirements-bench.txt
	$(PY) -m pip install --quiet -r requirements-bench.txt
	touch $@

# Our durable step beside LangGraph + PostgresSaver (sync), interleaved rounds, on PostgreSQL (bench/README.md).
# Creates and drops its own databases. BENCH_ARGS e.g. "--rounds 5 --runs 10".
.PHONY: bench bench-step
bench: $(VENV)/.bench-installed
	$(PY) bench/step_overhead.py --peer $(BENCH_ARGS)

# Ours alone: time, queries, transactions and bytes per step at 10 and 100 messages of history.
bench-step: $(VENV)/.dev-installed
	$(PY) bench/step_overhead.py $(BENCH_ARGS)

# Flow scheduling per node: a 20-node, 10-wide flow in-process and on a Celery worker, beside LangGraph + PostgresSaver
# (sync), interleaved rounds, on PostgreSQL + Redis (bench/README.md). Own databases. BENCH_ARGS e.g. "--rounds 5 --runs 10".
.PHONY: bench-flow
bench-flow: $(VENV)/.bench-installed
	$(PY) bench/flow_overhead.py $(BENCH_ARGS)

# One model turn of several slow tool calls (run side by side), beside LangGraph's create_react_agent (bench/README.md).
.PHONY: bench-turn
bench-turn: $(VENV)/.bench-installed
	$(PY) bench/turn_calls.py $(BENCH_ARGS)

# Replaying 1,000 recorded runs in recorded mode (issue #16): runs/s and ms per replayed step beside the original
# run's, on PostgreSQL (bench/README.md). Own database. BENCH_ARGS e.g. "--runs 1000 --rounds 3".
.PHONY: bench-replay
bench-replay: $(VENV)/.dev-installed
	$(PY) bench/replay_recorded.py $(BENCH_ARGS)

# The tool gateway's own overhead per call and the audit write's cost, on PostgreSQL (bench/README.md). Own database too.
.PHONY: bench-gateway
bench-gateway: $(VENV)/.dev-installed
	$(PY) bench/gateway_overhead.py $(BENCH_ARGS)

# What masking costs per string and per event payload, with its gates and with every pattern run (bench/README.md).
.PHONY: bench-masking
bench-masking: $(VENV)/.installed
	$(PY) bench/masking.py $(BENCH_ARGS)

# The API under load: 200 reads/s + 20 creates/s against server + worker, and a bare ASGI peer (bench/README.md). Own database.
.PHONY: bench-api
bench-api: $(VENV)/.dev-installed
	$(PY) bench/api_load.py $(BENCH_ARGS)

# Live trace fan-out to 1 and 50 websocket viewers, ours vs a bare Channels consumer, on PostgreSQL + Redis (bench/README.md).
.PHONY: bench-trace
bench-trace: $(VENV)/.dev-installed
	$(PY) bench/trace_fanout.py $(BENCH_ARGS)

# Time to first streamed delta over SSE (issue #18): the live stack of the streaming tests, 20 runs; prints the figures.
# With DATABASE_URL/REDIS_URL set it measures the production mode (separate worker), else the embedded one.
.PHONY: bench-stream
bench-stream: $(VENV)/.dev-installed
	DEBUG=false HTTPS_ONLY=false SECRET_KEY=bench-only-secret-key-0123456789abcdefghijkl $(VENV)/bin/pytest -q -s -p no:cacheprovider bench/stream_latency.py

# Issue #50's fault suite on a stack of its own (own redis-server, own PostgreSQL cluster, own counting target): worker
# SIGKILLs, Redis outages (kept and emptied), PostgreSQL restarts and a table lock under agent runs, refund-desk flow runs,
# replays and approval notices; PASS/FAIL per goal, exit 1 when one fails (bench/README.md). BENCH_ARGS e.g. "--full".
.PHONY: bench-faults
bench-faults: $(VENV)/.dev-installed
	$(PY) bench/faults.py $(BENCH_ARGS)

# The two-step demo end to end at 20 in flight: runs/s, POST -> finished, queue wait vs execution (bench/README.md).
.PHONY: bench-throughput
bench-throughput: $(VENV)/.dev-installed
	$(PY) bench/throughput.py $(BENCH_ARGS)

# Fairness between tenants (issue #49): one tenant's short runs alone and while another floods the worker with slow
# runs, interleaved rounds, server + one 4-thread worker on PostgreSQL + Redis (bench/README.md). Own database.
.PHONY: bench-fair
bench-fair: $(VENV)/.dev-installed
	$(PY) bench/fairness.py $(BENCH_ARGS)

# A clean venv from requirements.txt only, then server + worker + beat on PostgreSQL/Redis and one demo run (CI runs it).
.PHONY: smoke-production
smoke-production:
	bash .ci/smoke-production

clean:
	rm -rf var/test-db.sqlite3* .pytest_cache
