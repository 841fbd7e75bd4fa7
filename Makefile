# Two commands for a fresh clone: `make demo` and `make test`. Both set up .venv first (idempotent).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torchvision has no CPU-only build on the package index: install it together with the torch it was
# built against (CUDA wheels; they run on the CPU too). Keep the two pins in step.
TORCH := torch==2.14.1 torchvision==0.29.2
STAMP := $(VENV)/.installed

.PHONY: setup test demo clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)   # more time on a slow machine: make demo DEMO_ARGS="--minutes 30"
	$(PY) tools/demo.py $(DEMO_ARGS)

clean:
	rm -rf outputs lightning_logs .pytest_cache
