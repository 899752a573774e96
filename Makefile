# The two commands for a fresh machine: `make demo` and `make test`. Each builds .venv itself.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pytest keeps each test module, its asserts rewritten, in __pycache__, and Python the package's bytecode; with
# PYTHONDONTWRITEBYTECODE set (as on this machine) every pytest process compiled and rewrote ~230 modules again:
# collecting the fast tier took 14 s instead of 5.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-fast test-reverse bench schema clean

$(STAMP): requirements.txt requirements.lock requirements-local.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt -c requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

# The local loop, the whole story: start the local environment, train a run long enough to see
# the reward rise, follow it to its end, snapshot its checkpoints' manifests and verify them, draw
# its report, wait for the idle GPU pool to be reaped, show what it cost, and stop everything that was
# started (also when a stage fails).
DEMO_STEPS ?= 40
demo: $(STAMP)
	$(BIN)/rlops validate
	@run=demo-$$(date +%H%M%S); \
	stage() { printf '\n== %s\n' "$$1"; }; \
	reaped() { for tick in $$(seq 24); do \
	    said=$$($(BIN)/rlops reap local) || return 1; echo "$$said"; \
	    case "$$said" in "scaled down"*|*"already scaled down"*) return 0;; esac; sleep 5; \
	  done; echo "the pool was not reaped within 2 minutes"; return 1; }; \
	stage "up: Ray head, a GPU-pool worker, the state bucket, Pub/Sub, the functions"; \
	$(BIN)/rlops up local && \
	stage "train: run $$run of tiny-arith, $(DEMO_STEPS) GRPO steps on CPU" && \
	$(BIN)/rlops train local --recipe tiny-arith --run $$run --set max_steps=$(DEMO_STEPS) && \
	$(BIN)/rlops status local --run $$run --follow && \
	stage "snapshot: crc32c manifests of the run's complete checkpoints" && \
	$(BIN)/rlops snapshot local && \
	$(BIN)/rlops checkpoints list local $$run && \
	stage "report: reward, step time and checkpoint saves" && \
	$(BIN)/rlops report local $$run && \
	grep -E '^- (state|mean reward|cost)' reports/local/$$run/report.md && \
	stage "reap: the GPU pool stops once it has been idle for the local idle timeout (30 s)" && \
	reaped && \
	stage "cost: the local GPU-pool node counted as one a3-ultragpu-8g (local.gpu_pool.counts_as)" && \
	$(BIN)/rlops cost local; \
	outcome=$$?; \
	stage "down: everything up started"; \
	$(BIN)/rlops down local; \
	exit $$outcome

# Four workers on two cores: much of the suite waits on servers, Ray and late joins rather than computing. The tests
# that share a module-scoped fixture (a local stack, a Ray head, a deploy) go to one worker together (`loadgroup`,
# tests/conftest.py groups them), so each such fixture is built once; the rest go wherever a worker is free.
# Then the fast tier again, reversed, in one process: each test must pass after any other (`make test-reverse`
# reverses all of it).
PYTEST_WORKERS ?= 4
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadgroup

test: $(STAMP)
	$(BIN)/lint-imports --no-cache
	$(BIN)/ruff check functions tests bench tools
	$(BIN)/pyright --project pyproject.toml
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) --durations=15
	RLOPS_TEST_FAST=1 $(BIN)/python -m pytest -q -m "not servers and not exhaustive" --reverse

# The tier to run after every change: no server, no other process, nothing exhaustive (tests/conftest.py refuses
# a test that starts one without the `servers` mark). `make test` runs everything.
test-fast: $(STAMP)
	RLOPS_TEST_FAST=1 $(BIN)/python -m pytest -q -m "not servers and not exhaustive" -n 2 --durations=5

# Every test in reverse order: each must pass alone and after any other.
test-reverse: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) --reverse

bench: $(STAMP)
	$(BIN)/python bench/validate.py
	$(BIN)/python bench/plan.py
	$(BIN)/python bench/doctor.py
	$(BIN)/python bench/coldstart.py
	$(BIN)/python bench/snapshot.py
	$(BIN)/python bench/export.py
	$(BIN)/python bench/resume.py
	$(BIN)/python bench/reaper.py
	PYTHONPATH=tests $(BIN)/python bench/interleavings.py

schema: $(STAMP)
	$(BIN)/rlops schema > environments/schema.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
