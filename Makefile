# Two entry points: `make run` (the whole pipeline on config/config.yaml) and `make test`.
# Both create .venv and install the pinned dependencies first, once (redone when they change).

VENV := .venv
STAMP := $(VENV)/.installed
PYTHON ?= python3
CONFIG ?= config/config.yaml
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: run test test-fast lint dry-run clean

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet -r requirements.txt
	$(VENV)/bin/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

run: $(STAMP)
	snakemake --cores all --configfile $(CONFIG)

# The unit lane (tests/unit) less its slow and multi-process tests: the inner loop, ~2 minutes.
test-fast: $(STAMP)
	pytest -q tests/unit -m "not slow and not process"

# Every test, in five lanes at once, each given its folders (collecting only those: ~13 s of CPU a lane
# collecting the whole tree): the Snakemake DAG runs (tests/dag), the stage tags' runs
# (tests/dag/test_tags.py), the Slurm cluster's (tests/slurm: they mostly wait on the scheduler and the
# executor plugin's status polling) followed by the process tests (tests/process: torchrun's ranks, the
# stage scripts), the bench scripts' quick runs and the GPU check's dry runs (tests/bench), the plans'
# unit tests (the rehearsal's, the memory plan's, the gate's, decoding's) and the rest (tests/unit). The
# lanes are balanced by their measured CPU (docs/benchmarks.md, "The test suite's lanes"): the longest
# lane is the suite's time, and with one thread a process (below) a lane left running alone holds one
# core of the two (the unit tests in one lane ran on alone for 7 of 34 minutes on an AVX2 machine).
# Each lane's output is printed after the rest's; the target fails if any lane did. Plain `pytest`
# runs the same tests one after the other (tests/conftest.py marks each test by its folder, so `-m dag`
# and the like pick them too).
# The lanes ask for more threads than the 2 cores have (each runs torch and Snakemake jobs of 2 threads):
# torch's OpenMP threads then spin-wait for each other at every op for cores another lane holds.
# Spinning 1,000 rounds instead of 300,000 before sleeping: four 2-thread tiny training loops at once
# took 8.4 s instead of 44.7 s here, one alone 1.1 s instead of 0.9 (docs/testing.md).
# And one OpenMP thread a process: the lanes' tests and jobs are tiny, and four lanes of 2-thread
# processes on 2 cores pay for threads they cannot run at once (two lanes of unit tests: 162-184 s of
# machine CPU with torch's 2 threads, 127-131 s with 1; docs/benchmarks.md). The smoke and train
# stages still take their rule's threads (torch.set_num_threads), so those paths run as users run them.
test: export GOMP_SPINCOUNT := 1000
test: export OMP_NUM_THREADS := 1
LANE_dag := tests/dag --ignore=tests/dag/test_tags.py
LANE_tags := tests/dag/test_tags.py
LANE_slurm := tests/slurm tests/process
LANE_bench := tests/bench
LANE_plans := tests/unit/rehearse tests/unit/plan tests/unit/gate tests/unit/generate
LANES := dag tags slurm bench plans  # beside them, the rest: every other folder
test: $(STAMP)
	@$(foreach lane,$(LANES),pytest -q $(LANE_$(lane)) > .pytest-$(lane).log 2>&1 & echo $$! > .pytest-$(lane).pid;) \
	pytest -q --ignore=tests/dag --ignore=tests/slurm --ignore=tests/process --ignore=tests/bench \
		$(foreach folder,$(LANE_plans),--ignore=$(folder)); code=$$?; \
	for lane in $(LANES); do \
		wait $$(cat .pytest-$$lane.pid); lane_code=$$?; rm -f .pytest-$$lane.pid; \
		echo "=== the $$lane lane (run beside the above; log: .pytest-$$lane.log) ==="; \
		cat .pytest-$$lane.log; \
		[ $$lane_code -eq 0 ] || code=1; \
	done; \
	exit $$code

lint: $(STAMP)
	ruff check .
	ruff format --check .
	snakemake --lint

dry-run: $(STAMP)
	snakemake -n --configfile $(CONFIG)

clean:
	rm -rf .snakemake results
