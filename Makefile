# DigenRL developer entry points. `make setup` then `make demo`; `make test` runs the suite; `make docs` the site.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# CPU build by default (on this project's machines torch==2.13.0 is on disk). GPU users:
#   make setup TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
# or install their own torch into .venv first and pass TORCH_SPEC="" to keep it.
TORCH_SPEC ?= torch==2.13.0
# test processes (pytest-xdist; whole files per process, so a file's fixtures and its Ray are set up once; the
# longest files first, in tests/conftest.py's order: --no-loadscope-reorder keeps it).
# 2 fits this project's 2-core machines; TEST_WORKERS=0 runs the suite in this one process.
TEST_WORKERS ?= 2

.PHONY: setup demo test test-fast docs

setup:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	@if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/pip install $(TORCH_SPEC); fi
	$(BIN)/pip install -e '.[test,docs]'

demo:  # --overwrite: each `make demo` replaces the previous demo run in runs/demo
	$(BIN)/digenrl train --overwrite

test:  # (the slowest 25 listed at the end: where the suite time goes)
	$(BIN)/python -m pytest tests -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

test-fast:  # the quick subset for development: no Ray runs, no subprocess or demo-length runs (tests/slow.txt)
	$(BIN)/python -m pytest tests -m "not slow"

docs:  # the docs site into site/: mkdocs --strict, so a warning, a broken link or anchor, or a page outside the nav fails
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
