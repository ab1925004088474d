# autotune — newcomer entry points:
#   make search   the main job: an autotune study on the default SQLite storage (installs what is missing)
#   make test     the test suite (installs what is missing)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.setup-done
# The IPEX runtime: intel-extension-for-pytorch 2.8.0 imports only with torch 2.8.0, so IPEX trials run
# in their own environment beside the main one (found there by autotune).
IPEX_VENV  := .venv-ipex
IPEX_STAMP := $(IPEX_VENV)/.setup-done
# Allocators and numactl for the search. For the tests only: chromium opens the dashboard and the report;
# PostgreSQL and MariaDB servers are started by the tests of a study shared by several workers.
APT_PACKAGES      := libgoogle-perftools4 libjemalloc2 numactl
TEST_APT_PACKAGES := chromium postgresql mariadb-server

# The two runtimes hold about 14 GB of wheels (torch with its CUDA libraries, twice): pip keeps no second copy in
# its cache, so setup fits on a disk with less room.
export PIP_NO_CACHE_DIR := 1

MODEL  ?= resnet50
BUDGET ?= 20m
ARGS   ?=

.PHONY: setup system-packages test-system-packages search test lint clean-venv

setup: $(STAMP) $(IPEX_STAMP)

$(STAMP): pyproject.toml constraints.txt
	@$(MAKE) --no-print-directory system-packages
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'
	@touch $(STAMP)

$(IPEX_STAMP): constraints-ipex.txt pyproject.toml
	$(PYTHON) -m venv $(IPEX_VENV)
	$(IPEX_VENV)/bin/pip install --quiet --upgrade pip
	$(IPEX_VENV)/bin/pip install --quiet -r constraints-ipex.txt
	$(IPEX_VENV)/bin/pip install --quiet --no-deps -e .
	@touch $(IPEX_STAMP)

# Debian packages: installed when running as root, otherwise reported with the command that installs them.
define apt_install
	@missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian packages: $$missing"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >/dev/null; \
	else \
		echo "warning: missing Debian packages ($$missing); run 'sudo apt-get install $$missing' ($(2))"; \
	fi
endef

system-packages:
	$(call apt_install,$(APT_PACKAGES),to search those allocators)

test-system-packages:
	$(call apt_install,$(TEST_APT_PACKAGES),the tests that need them fail without)

search: setup
	$(BIN)/autotune search --model $(MODEL) --budget $(BUDGET) $(ARGS)

test: setup test-system-packages
	$(BIN)/python -m pytest -q $(ARGS)

# Format, lint and type checks (configured in pyproject.toml); CI runs them before the tests.
lint: setup
	$(BIN)/ruff format --check autotune tests docs
	$(BIN)/ruff check autotune tests docs
	$(BIN)/mypy

clean-venv:
	rm -rf $(VENV) $(IPEX_VENV)
