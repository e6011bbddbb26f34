# AutoMDT developer entry points. Every target sets itself up on a fresh machine:
# system packages (Debian, as root), a virtual environment in .venv with pinned
# dependencies, and an editable install that builds the C engine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.automdt-installed
SYSPKG := libxxhash-dev libssl-dev
# The source folders of the installed packages: their bytecode is compiled at set-up, as a wheel
# install does (an editable install leaves it to the first run, which cannot write it when
# PYTHONDONTWRITEBYTECODE is set: every run would then compile them, ~0.1 s of start-up).
PKG_DIRS := automdt agents simulator transfer_engine experiments

.PHONY: setup demo lint test test-all bench build clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py requirements.lock $(wildcard transfer_engine/src/*.c transfer_engine/src/*.h)
	@if [ ! -f /usr/include/xxhash.h ] || [ ! -f /usr/include/openssl/ssl.h ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSPKG)) ; \
	  else echo "automdt: please install $(SYSPKG) (xxHash and OpenSSL headers) as root" >&2; exit 1; fi ; fi
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@$(PY) -m compileall -q $(PKG_DIRS) >/dev/null
	@touch $(STAMP)

build: setup
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@$(PY) -m compileall -q $(PKG_DIRS) >/dev/null

demo: setup
	$(VENV)/bin/automdt demo

# The house rules (pyproject.toml): ruff, then mypy and import-linter on a link tree of the
# installed layout (scripts/lint_tree.py). All three run; any finding fails the target.
# Seconds once mypy's cache in build/ is warm.
LINT_TREE := build/lint-tree

lint: setup
	@$(PY) scripts/lint_tree.py $(LINT_TREE) >/dev/null
	@rc=0; \
	echo "ruff check ."; $(PY) -m ruff check --quiet . || rc=1; \
	echo "mypy -p automdt"; (cd $(LINT_TREE) && ../../$(PY) -m mypy --config-file ../../pyproject.toml \
	  --cache-dir ../mypy-cache -p automdt) || rc=1; \
	echo "lint-imports"; (cd $(LINT_TREE) && PYTHONPATH=. ../../$(VENV)/bin/lint-imports \
	  --config ../../pyproject.toml --no-cache --no-logo) || rc=1; \
	exit $$rc

test: setup lint
	$(PY) -m pytest -q

test-all: setup lint
	$(PY) -m pytest -q -m ""

bench: setup
	$(PY) benchmarks/bench_engine.py

clean:
	rm -rf build *.egg-info transfer_engine/*.so $(VENV)
