# Two entry points: `make run` (the whole pipeline on config/config.yaml) and `make test`.
# Both create .venv and install the pinned dependencies first, once (redone when they change).

VENV := .venv
STAMP := $(VENV)/.installed
PYTHON ?= python3
CONFIG ?= config/config.yaml
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: run test lint dry-run clean

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet -r requirements.txt
	$(VENV)/bin/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

run: $(STAMP)
	snakemake --cores all --configfile $(CONFIG)

test: $(STAMP)
	pytest -q

lint: $(STAMP)
	ruff check .
	ruff format --check .
	snakemake --lint

dry-run: $(STAMP)
	snakemake -n --configfile $(CONFIG)

clean:
	rm -rf .snakemake results
