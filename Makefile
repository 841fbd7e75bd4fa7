# Commands for a fresh clone: `make demo`, `make test` (the quick tier: every parity test, no CLI runs, Trainer
# fits, exports, servers, browsers or subprocesses) and `make test-all` (everything; what CI runs, .ci/run). Each
# sets up .venv first (idempotent). The tiers are markers that tests/conftest.py sets (tests/tiers.py).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torchvision has no CPU-only build on the package index: install it together with the torch it was
# built against (CUDA wheels; they run on the CPU too). Keep the two pins in step.
TORCH := torch==2.14.1 torchvision==0.29.2
STAMP := $(VENV)/.installed

# pytest-xdist workers, each with its share of the threads (tests/conftest.py); TEST_WORKERS=0 runs in one
# process. A crashed worker is replaced at most once: xdist's default (4 per worker) can run a crashing test's
# file again and again before the run ends.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --max-worker-restart=1 --durations=15

.PHONY: setup test test-all demo clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e ".[test]"
	# the rfdetr package's model code, for the keypoint parity tests only (tests/helpers_rfdetr_package.py): its
	# own folder, without its dependencies, never importable as a dependency of this project
	$(PY) -m pip install --quiet --no-deps --target $(VENV)/rfdetr_package rfdetr==1.8.0
	touch $(STAMP)

test: $(STAMP)
	$(PYTEST) -m "not integration"

test-all: $(STAMP)
	$(PYTEST)

demo: $(STAMP)   # more time on a slow machine: make demo DEMO_ARGS="--minutes 30"
	$(PY) tools/demo.py $(DEMO_ARGS)

clean:
	rm -rf outputs lightning_logs .pytest_cache
