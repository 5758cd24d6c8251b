# Two commands: `make run` (fresh machine: venv, install, migrate, seed, serve) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
export DEBUG ?= true

.PHONY: run test lint unit worker migrate seed clean

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
	$(VENV)/bin/celery -A config worker --loglevel=INFO --pool=threads --concurrency=4 -Q agentops

lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy agents/runtime

# The whole suite in the configured mode (DATABASE_URL/REDIS_URL set: PostgreSQL + Redis + a separate
# Celery worker process; unset: the embedded default). When it ran on PostgreSQL/Redis, the live-stack
# tests run a second time on the embedded default, so both run modes are exercised.
test: $(VENV)/.dev-installed lint
	DEBUG=false SECRET_KEY=test-only-secret-key-0123456789abcdefghij $(VENV)/bin/pytest $(PYTEST_ARGS)
	@if [ -n "$$REDIS_URL" ]; then \
		echo "== live-stack tests again on the embedded default (SQLite, in-process worker) =="; \
		env -u DATABASE_URL -u REDIS_URL DEBUG=false SECRET_KEY=test-only-secret-key-0123456789abcdefghij \
			$(VENV)/bin/pytest tests/integration $(PYTEST_ARGS); \
	fi

clean:
	rm -rf var/test-db.sqlite3* .pytest_cache
