# Two commands do everything on a fresh Debian 12 / Python 3.11 machine:
#   make demo   set up (first run: a few minutes), then run the end-to-end demo
#   make test   set up, then run the whole test suite (the import-layering contract in
#               .importlinter included: test/unit/test_layout.py)
# Set-up is idempotent: finished steps are skipped in seconds.

VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-fast bench golden soak clean

setup:
	@bash scripts/bootstrap.sh

demo: setup
	$(VENV)/bin/timelyllm demo

test: setup
	$(PY) -m pytest

# Core only: no ROS processes, no vLLM engine (seconds).
test-fast: setup
	$(PY) -m pytest -m "not ros and not vllm"

# Every figure of the simulated bench, whole workloads, against the golden records: the paper's
# comparison recorded before the redesign, and the planner's default policy and baselines on
# issue 22's loads (a few minutes; `make test` checks a prefix of each workload).
golden: setup
	$(PY) tools/golden_bench.py check --full

bench: setup
	$(VENV)/bin/timelyllm bench --workload WID1 --policies vllm,vllm-stream,fcfs-seg,edf-seg,timelyllm --engine sim

# 200 simulated robots (one fleet-simulator process) against the planner on the wall-clock
# simulated engine, over ROS, for 10 minutes plus the drain; figures to docs/soak/.
soak: setup
	$(VENV)/bin/timelyllm soak --robots 200 --duration-s 600 --out docs/soak

clean:
	rm -rf .cache out models build install log
