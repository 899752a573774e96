# The two commands for a fresh machine: `make demo` and `make test`. Each builds .venv itself.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench schema clean

$(STAMP): requirements.txt requirements-local.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

# The local loop: start the local environment, send a train message, follow the run to its end,
# show the runs, stop everything that was started (also when the run fails).
demo: $(STAMP)
	$(BIN)/rlops validate
	@run=demo-$$(date +%H%M%S); \
	$(BIN)/rlops up local && \
	$(BIN)/rlops train local --recipe tiny-arith --run $$run --set max_steps=6 && \
	$(BIN)/rlops status local --run $$run --follow; \
	outcome=$$?; \
	$(BIN)/rlops status local; \
	$(BIN)/rlops down local; \
	exit $$outcome

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/validate.py
	$(BIN)/python bench/plan.py
	$(BIN)/python bench/coldstart.py
	$(BIN)/python bench/snapshot.py
	$(BIN)/python bench/reaper.py

schema: $(STAMP)
	$(BIN)/rlops schema > environments/schema.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
