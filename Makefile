# PAI's two entry points: `make up` runs the platform, `make test` runs the tests.
# Both create the virtualenv .venv and install what they need into it.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test test-fast test-gpu install clean lint bench browser-deps postgres-deps container-deps openpai-sdk-deps ssh-deps alerting-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# setup.py builds the one C extension (optional: without a compiler the install still
# succeeds); a change to it or to its source rebuilds it.
$(STAMP): pyproject.toml setup.py services/launcher/backends/_spawn_as.c | $(BIN)/python
	$(BIN)/pip install -q -e ".[test,sim]"
	touch $(STAMP)

install: $(STAMP)

## Run nats-server and the five services on this machine, submit an example job.
up: $(STAMP)
	$(BIN)/pai up --example examples/hello.yaml

# Debian's chromium for the browser tests (playwright comes with the test extra).
browser-deps:
	sh tests/browser/install-chromium.sh

# OpenPAI's JavaScript SDK for tests/integration/test_openpai_sdk.py, from its lock file
# (npm ci: the pinned versions, from npm's cache when it has them). Skipped without npm.
openpai-sdk-deps:
	@if command -v npm >/dev/null 2>&1; then cd tests/openpai_sdk && \
		npm ci --no-audit --no-fund --prefer-offline --loglevel=error >/dev/null; \
	else echo "npm is not installed: the OpenPAI SDK test will skip" >&2; fi

# Debian's PostgreSQL for the history tests, which start a cluster of their own
# (tests/fixtures/postgres.py): installed as root when initdb is missing, without the
# package's own cluster. Quick when it is there already.
postgres-deps:
	@if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		mkdir -p /etc/postgresql-common && \
		(grep -qs '^create_main_cluster' /etc/postgresql-common/createcluster.conf || \
			echo 'create_main_cluster = false' >> /etc/postgresql-common/createcluster.conf) && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold postgresql >/dev/null; \
	else echo "PostgreSQL is not installed and this is not root on Debian: the history tests on PostgreSQL will skip (apt-get install postgresql)" >&2; fi

# Debian's podman (rootful, runc) for the container tier (tests/containers): installed
# as root when missing; PAI's own engine configuration (deploy/containers, passed as
# CONTAINERS_CONF / CONTAINERS_STORAGE_CONF, the host's /etc/containers untouched); then
# the test images built from this machine's files, no registry (quick when built).
container-deps:
	@if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1 || ! command -v busybox >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
				podman runc conmon netavark busybox-static >/dev/null; \
		else echo "podman is not installed and this is not root on Debian: the container tier will skip (apt-get install podman runc busybox-static)" >&2; fi; \
	fi
	@if command -v podman >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then sh tests/containers/build-images.sh; fi

# Debian's OpenSSH (client and server) and libnss_wrapper for the ssh plugin's tests
# (tests/integration/test_ssh.py): installed as root when missing; the package's own
# sshd service is not what PAI runs (each task starts its own).
ssh-deps:
	@if ! command -v ssh >/dev/null 2>&1 || [ ! -x /usr/sbin/sshd ] || ! ls /usr/lib/*/libnss_wrapper.so >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
				openssh-client openssh-server libnss-wrapper >/dev/null; \
		else echo "OpenSSH or libnss_wrapper is missing and this is not root on Debian: the ssh tests will skip (apt-get install openssh-client openssh-server libnss-wrapper)" >&2; fi; \
	fi

# Debian's Prometheus tools for the alerting tests (tests/component/test_alert_routes.py):
# promtool checks the chart's PrometheusRule, a real Alertmanager receives the
# monitor's alerts. Installed as root when missing; the packages' own services are not
# what the tests run (each test starts its own Alertmanager on a free port).
alerting-deps:
	@if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus-alertmanager >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
				-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
				prometheus prometheus-alertmanager >/dev/null; \
		else echo "promtool or Alertmanager is missing and this is not root on Debian: the alerting tests will skip (apt-get install prometheus prometheus-alertmanager)" >&2; fi; \
	fi

# The tests run in TEST_WORKERS processes (pytest-xdist): each module whole on one, and
# the modules that run tasks on the local backend one after another on one (their
# group, tests/conftest.py); the others side by side with them, so that the tests that
# wait (on timers, services, tasks) overlap with those that compute. Modules are
# handed out in file order, the local-backend group (browser, chaos, integration, the
# local backend's component tests) first. TEST_WORKERS=0: one process, as before.
TEST_WORKERS ?= 2

## Ruff over the whole tree, then mypy (strict on the cores and the protocol package);
## both are configured in pyproject.toml and come with the test extra.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

## Install everything the tests need, lint, then run every test tier.
test: $(STAMP) lint browser-deps postgres-deps openpai-sdk-deps container-deps ssh-deps alerting-deps
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder \
		--durations=30

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -x tests/unit

## The GPU tier alone (tests/gpu: skips, saying why, where NVML finds no GPU).
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -rs tests/gpu

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b; done

clean:
	rm -rf $(VENV) .pai .pytest_cache
