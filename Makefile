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

# Two lanes at once: the Slurm tests (tests/slurm, ~6 min) mostly wait on the scheduler and on the
# executor plugin's status polling, not on the CPU, so they run beside the rest of the suite; their
# output is printed after it. Plain `pytest` runs the same tests one after the other.
test: $(STAMP)
	@pytest -q -m slurm > .pytest-slurm.log 2>&1 & slurm=$$!; \
	pytest -q -m "not slurm"; rest=$$?; \
	wait $$slurm; code=$$?; \
	echo "=== the Slurm lane (pytest -q -m slurm, run beside the above; log: .pytest-slurm.log) ==="; \
	cat .pytest-slurm.log; \
	exit $$(( rest != 0 || code != 0 ))

lint: $(STAMP)
	ruff check .
	ruff format --check .
	snakemake --lint

dry-run: $(STAMP)
	snakemake -n --configfile $(CONFIG)

clean:
	rm -rf .snakemake results
