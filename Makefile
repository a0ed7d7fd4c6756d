# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/aioccl-run --nproc-per-node 4 --no-prefix examples/demo.py

test: $(STAMP)
	$(PY) -m ruff check aioccl jax_ext tests examples benchmarks
	$(PY) -m pytest -q tests

lint: $(STAMP)
	$(PY) -m ruff check aioccl jax_ext tests examples benchmarks

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
