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

.PHONY: setup demo lint test test-all bench build clean docs notebooks-render

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py requirements.lock $(wildcard transfer_engine/src/*.c transfer_engine/src/*.h)
	@if [ ! -f /usr/include/xxhash.h ] || [ ! -f /usr/include/openssl/ssl.h ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSPKG)) ; \
	  else echo "automdt: please install $(SYSPKG) (xxHash and OpenSSL headers) as root" >&2; exit 1; fi ; fi
	@# libfuse 3 for the power-loss harness (tests/faults/crashdisk.py; without it those tests skip)
	@if [ "$$(id -u)" = 0 ] && ! ldconfig -p 2>/dev/null | grep -q 'libfuse3\.so\.3'; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfuse3-3) \
	  || echo "automdt: no libfuse 3: the power-loss tests will be skipped" >&2 ; fi
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

# The documentation site (docs/, Sphinx + furo + MyST) and the man page automdt(1), both from the
# sources: the CLI reference from automdt.cli.build_parser(), exit codes from automdt.errors, the
# tables of figures from the results files, the notebooks from their committed outputs.
# -W --keep-going: every warning is an error (all of them listed); -n: every reference resolves.
# Output: docs/_build/html/index.html and docs/_build/man/automdt.1.
DOCS_BUILD := docs/_build
SPHINX     := $(PY) -m sphinx -W --keep-going -n -q

docs: setup
	@rm -rf $(DOCS_BUILD)
	$(SPHINX) -b html -d $(DOCS_BUILD)/doctrees docs $(DOCS_BUILD)/html
	$(SPHINX) -b man -d $(DOCS_BUILD)/doctrees docs $(DOCS_BUILD)/man
	$(PY) docs/_ext/automdt_docs.py --check || { echo "README.md's generated block is stale: $(PY) docs/_ext/automdt_docs.py --readme" >&2; exit 1; }
	@echo "docs: $(DOCS_BUILD)/html/index.html, $(DOCS_BUILD)/man/automdt.1 (man -l $(DOCS_BUILD)/man/automdt.1)"

# Execute the notebooks once (small parameters, as tests/notebooks does) into docs/notebooks/ with
# their outputs, which are committed: the site shows the plots without running anything.
# Minutes of real transfers and training: run it when a notebook or its results change.
notebooks-render: setup
	$(PY) docs/tools/render_notebooks.py

clean:
	rm -rf build *.egg-info transfer_engine/*.so $(VENV) docs/_build
