# Two entry points for a fresh machine: `make demo` (open the app with the built-in demo) and
# `make test` (the full test suite). Both create .venv with the pinned constraints first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[gui,test,reproduce]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/ram-desktop --demo

test: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build dist *.egg-info
