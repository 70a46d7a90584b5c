# Two commands: `make demo` and `make test`. Each creates .venv when missing
# and installs vigil with everything it needs before running.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# torch is pinned: an unpinned torch pulls gigabytes of CUDA wheels.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[dev,torch]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/vigil demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .state
