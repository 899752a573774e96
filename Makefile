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

demo: $(STAMP)
	$(BIN)/rlops validate
	$(BIN)/rlops validate --describe environments/local.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/validate.py
	$(BIN)/python bench/plan.py

schema: $(STAMP)
	$(BIN)/rlops schema > environments/schema.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
