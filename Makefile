# The README's commands. Everything installs into .venv at the repository root.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.aiter-installed

.PHONY: aot test fast lint format venv clean-venv emulated-coverage

$(STAMP): setup.py pyproject.toml $(wildcard csrc/*)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install "setuptools>=64" wheel
	# The CPU build of torch first, by exact version; nothing below may replace it.
	$(PY) -m pip install "torch==2.13.0"
	$(PY) -m pip install --no-build-isolation -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

aot: $(STAMP)
	$(PY) -m aiter.aot.flydsl

# Every test, over the machine's two cores; a file's tests stay on one worker, so the caches its
# fixtures build are built once.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

# The inner loop: everything but the slow tests, over the machine's two cores.
fast: $(STAMP)
	$(PY) -m pytest -m "not slow" -n 2 --dist worksteal

# Every kernel of the default cache of gfx942 and gfx950 run on the emulator: the suite's cases,
# then a small call for each listed kernel they left; coverage per family in build/emulated/.
EMULATED := build/emulated
emulated-coverage: $(STAMP)
	mkdir -p $(EMULATED)
	set -e; for arch in gfx942 gfx950; do \
		GPU_ARCHS=$$arch $(PY) -m aiter.aot.flydsl --list --report $(EMULATED)/listing_$$arch.json; \
		FLYDSL_RUNTIME_CACHE_DIR=$(EMULATED)/cache_$$arch $(PY) -m op_tests.emulated.runner $$arch \
			$(EMULATED)/suite_$$arch.json --listing $(EMULATED)/listing_$$arch.json || true; \
		$(PY) -m op_tests.emulated.coverage $(EMULATED)/suite_$$arch.json \
			$(EMULATED)/listing_$$arch.json --out $(EMULATED)/coverage_$$arch.txt; \
	done

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m black --check .

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m black .

clean-venv:
	rm -rf $(VENV)
