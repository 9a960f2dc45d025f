# The two commands of the README: `make demo` and `make test`.
# Each creates the virtual environment on first use (a fresh clone needs nothing else).
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $(STAMP)

.PHONY: install demo test bench
install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/trajlake demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile

bench: $(STAMP)
	$(VENV)/bin/python -m bench
