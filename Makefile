# Two commands do everything on a fresh Debian/Ubuntu machine with Docker:
#   make demo   venv, install, engine, images, then the triage example and its report
#   make test   the same set-up, then ruff, mypy (strict) and the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint images engine bench clean

$(STAMP): pyproject.toml
	scripts/ensure-engine.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

engine:
	scripts/ensure-engine.sh

images: $(STAMP) engine
	$(BIN)/orchestrator images build

lint: $(STAMP)
	$(BIN)/ruff check orchestrator tests bench examples
	$(BIN)/ruff format --check orchestrator tests bench examples
	$(BIN)/mypy

test: images lint
	TESTCONTAINERS_RYUK_DISABLED=true $(BIN)/pytest

demo: images
	rm -rf examples/triage/output
	$(BIN)/orchestrator run triage --project examples/triage
	@echo
	@cat examples/triage/output/report.md

bench: images
	$(BIN)/python bench/run_bench.py

clean:
	rm -rf $(VENV) examples/triage/output .pytest_cache .mypy_cache .ruff_cache
