# Two commands: `make demo` and `make test`. Each creates .venv when missing
# and installs vigil with everything it needs before running.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test install clean chromium

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "vigil needs Python >= 3.11; set PYTHON=python3.11")'
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { echo "the venv module is missing: apt-get install python3-venv"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# torch is pinned to the CPU build these machines carry locally (pip's find-links);
# an unpinned torch resolves to the newest release and its gigabytes of CUDA wheels.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[server,dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/vigil demo

# The HTML report's render test needs a headless browser: Debian's chromium, installed
# when missing and when this can (root with apt-get); otherwise that test is skipped.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium for the report render test..."; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	      || echo "chromium could not be installed: the report render test will be skipped"; \
	  else echo "chromium missing and not installable here (needs root and apt-get): the report render test will be skipped"; fi; }

# The unit tier runs on every core (up to 4): pure and CPU-bound. Of the integration tier, the files that
# check rows, outputs and counts run on two workers (a file each, conftest.py's CONCURRENT); the rest run
# alone, one test at a time: their real workers, agents and torch ranks must not be starved, as a false
# page on a starved host is what those tests look for.
test: $(STAMP) chromium
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 tests/unit
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m concurrent tests/integration
	$(BIN)/python -m pytest -q -m "not concurrent" tests/integration

clean:
	rm -rf $(VENV) .vigil
