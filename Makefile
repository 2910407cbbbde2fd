# PAI's two entry points: `make up` runs the platform, `make test` runs the tests.
# Both create the virtualenv .venv and install what they need into it.

# The interpreter .venv is made from (PYTHON=... chooses another). The distribution's
# CPython (/usr/bin/python3: Debian's is built with profile-guided optimisation and LTO,
# its executable linking libpython statically) when it is new enough and can make a
# virtualenv and build the launcher's C extension; else python3 from PATH. A version
# manager's default build (pyenv without PYTHON_CONFIGURE_OPTS) has none of that and runs
# every service with 5-10% more CPU (docs/throughput.md, "The interpreter").
DISTRO_PYTHON := /usr/bin/python3
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell $(DISTRO_PYTHON) -c 'import ensurepip, os, sys, sysconfig; sys.exit(sys.version_info < (3, 11) or not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' >/dev/null 2>&1 && echo $(DISTRO_PYTHON) || echo python3)
endif
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up compile test test-slow test-fast test-gpu install clean lint bench system-deps test-deps browser-deps postgres-deps container-deps openpai-sdk-deps ssh-deps alerting-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# setup.py builds the one C extension (optional: without a compiler the install still
# succeeds); a change to it or to its source rebuilds it.
$(STAMP): pyproject.toml setup.py services/launcher/backends/_spawn_as.c | $(BIN)/python
	$(BIN)/pip install -q -e ".[test,sim]"
	touch $(STAMP)

# PAI's own modules byte-compiled ahead (only those changed since): where Python writes
# no bytecode of its own (PYTHONDONTWRITEBYTECODE, as in many CI images) every service
# process would compile them again at each start, about a second of CPU for rest alone.
compile: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 libs services cli >/dev/null

install: $(STAMP)

## Run nats-server and the five services on this machine, submit an example job.
up: compile
	$(BIN)/pai up --example examples/hello.yaml

# OpenPAI's JavaScript SDK for tests/integration/test_openpai_sdk.py, from its lock file
# (npm ci: the pinned versions, from npm's cache when it has them). Skipped without npm.
openpai-sdk-deps:
	@if command -v npm >/dev/null 2>&1; then cd tests/openpai_sdk && \
		npm ci --no-audit --no-fund --prefer-offline --loglevel=error >/dev/null; \
	else echo "npm is not installed: the OpenPAI SDK test will skip" >&2; fi

# The Debian packages the tiers drive for real (Chromium, PostgreSQL, podman and the
# container tier's images, OpenSSH, promtool and Alertmanager), installed as root when
# missing in one apt-get run (tests/system-deps.sh); a tier whose program is absent
# and cannot be installed skips, saying why. One tier's alone: make browser-deps, ...
system-deps:
	sh tests/system-deps.sh

browser-deps postgres-deps container-deps ssh-deps alerting-deps:
	sh tests/system-deps.sh $(patsubst %-deps,%,$(subst container-deps,containers-deps,$@))

# What the tests need, fetched side by side (pip, apt and npm wait on the network
# more than on the two cores).
test-deps: $(STAMP) system-deps openpai-sdk-deps

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

## Install everything the tests need, lint (as soon as the virtualenv is there, beside
## apt's and npm's downloads), then run every test tier but the long scenarios.
test:
	$(MAKE) --no-print-directory -j3 --output-sync=target test-deps lint compile
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder \
		--durations=30 -m "not slow"

## The long scenarios (the `slow` marker: the chaos soak, a NATS cluster with a node cut
## off), kept out of `make test` so that it stays well under 15 minutes on two cores.
test-slow: test-deps compile
	$(BIN)/python -m pytest -q -p no:cacheprovider -m slow --durations=10

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -x tests/unit

## The GPU tier alone (tests/gpu: skips, saying why, where NVML finds no GPU).
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -rs tests/gpu

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b; done

clean:
	rm -rf $(VENV) .pai .pytest_cache
