# Two entry points for a fresh machine: `make demo` (open the app with the built-in demo) and
# `make test` (the full test suite). Both create .venv with the pinned constraints first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-mergekit install clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[gui,test,eval,reproduce]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/ram-desktop --demo

test: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q

# mergekit's own output compared bit for bit with ours (tests skip without it); its venv lives outside the repo
MERGEKIT_VENV ?= $(HOME)/.cache/ram-desktop/mergekit-venv
test-mergekit: $(STAMP)
	test -x $(MERGEKIT_VENV)/bin/mergekit-yaml || bash benchmarks/setup_mergekit.sh $(MERGEKIT_VENV)
	RAM_MERGEKIT=$(MERGEKIT_VENV)/bin/mergekit-yaml QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q \
		tests/test_mergekit_config.py tests/test_baselines.py -k mergekit

clean:
	rm -rf $(VENV) build dist *.egg-info
