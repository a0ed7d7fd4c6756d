# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JAX_VENV := .venv-jax
# not 0.12.1: examples/jax_shard_map.py across 2 processes hangs on it in about 4 runs of 10 (docs/jax.md)
JAX_NEWEST := jax>=0.12,<0.13,!=0.12.1
# ml_dtypes 0.7.0's import costs 0.5 s of CPU in every process that imports jax (pyproject.toml's test extra)
ML_DTYPES := ml_dtypes<0.7
JAX_TESTS := $(wildcard tests/test_jax_*.py)
NATIVE_SRC := CMakeLists.txt $(wildcard aioccl/native/src/*/*.c aioccl/native/src/*/*.h)  # a change rebuilds the core

.PHONY: demo test test-jax-newest lint types docs clean bench bench-jax stress

$(STAMP): pyproject.toml $(NATIVE_SRC)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch's CPU build first (this machine keeps its wheel on disk); a bare 'torch' would pull a CUDA build of GBs
	$(PY) -m pip install --quiet 'torch==2.13.0' || $(PY) -m pip install --quiet torch --index-url https://download.pytorch.org/whl/cpu
	$(PY) -m pip install --quiet -e '.[test]'
	sh scripts/provide-pyverbs.sh $(VENV)
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/aioccl-run --nproc-per-node 4 --no-prefix examples/demo.py

# the docs site (MkDocs Material + mkdocstrings) into site/, warnings as errors; the tests build it too
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# the suite's processes wait on each other, on deadlines and on their children as much as they compute: three
# pytest workers keep two cores busy (measured: 1 worker 13.1 min, 2 workers 8.5, 3 workers 7.7, for the
# main suite; tests/README.md says how tests share the machine, tests/suite_hygiene.py that nothing is left)
TEST_WORKERS ?= 3

# lint, types and the newest jax's tests side by side (mypy keeps one core; the jax tests' processes the other),
# each one's output kept together; then the main suite
test: $(STAMP) $(JAX_VENV)/.installed
	$(MAKE) --no-print-directory -j3 --output-sync=target lint types test-jax-newest
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal tests

types: $(STAMP)
	$(PY) -m mypy

# jax_ext's tests again on the newest jax, which needs Python >= 3.12: a second venv with only what they
# need (no torch: on 3.12+ pip would pull a CUDA build of GBs). JAX_PYTHON overrides the interpreter.
$(JAX_VENV)/.installed: pyproject.toml $(NATIVE_SRC)
	test -x $(JAX_VENV)/bin/python || $${JAX_PYTHON:-$$(sh scripts/find-python.sh 3.13 3.12)} -m venv $(JAX_VENV)
	$(JAX_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(JAX_VENV)/bin/python -m pip install --quiet -e . '$(JAX_NEWEST)' '$(ML_DTYPES)' pytest pytest-timeout pytest-asyncio pytest-xdist anyio
	touch $@

test-jax-newest: $(JAX_VENV)/.installed
	$(JAX_VENV)/bin/python -c 'import jax, sys; print("jax_ext tests on jax", jax.__version__, "Python", sys.version.split()[0])'
	$(JAX_VENV)/bin/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist worksteal $(JAX_TESTS)

# the hang hunter (not CI): the multi-process tests most likely to hang, looped for STRESS_MINUTES under random
# CPU pressure and the native core's schedule noise; each hang's stacks, dumps and seed under stress-out/
# (tests/README.md, "The hang hunter"). py-spy reads the ranks' Python and native stacks.
STRESS_MINUTES ?= 60
stress: $(STAMP)
	$(PY) -m pip install --quiet py-spy
	$(PY) scripts/stress.py --minutes $(STRESS_MINUTES)

# Side-by-side benchmarks (by hand, not CI): aioccl vs torch.distributed/Gloo vs Open MPI.
# Needs root for Open MPI from Debian; uses a local CPU torch wheel when there is one.
BENCH := .venv-bench
$(BENCH)/.installed: pyproject.toml $(NATIVE_SRC)
	test -x $(BENCH)/bin/python || $(PYTHON) -m venv $(BENCH)
	command -v mpirun >/dev/null || (apt-get update && apt-get install -y openmpi-bin libopenmpi-dev)
	T=$$(ls /opt/wheels/torch-*+cpu-*.whl 2>/dev/null | head -n 1); \
	$(BENCH)/bin/python -m pip install --quiet -e '.[perf]' mpi4py "$${T:-torch}"
	touch $@

bench: $(BENCH)/.installed
	$(BENCH)/bin/python benchmarks/compare.py --out docs/bench
	$(BENCH)/bin/python benchmarks/pipeline.py --out docs/bench

# the real mpi4jax, from PyPI's sdist built against Debian's Open MPI, in the benchmark venv: its CPU bridge
# only (CUDA_PATH at an empty folder: its setup.py otherwise builds the CUDA bridge wherever nvcc is found)
$(BENCH)/.mpi4jax: $(BENCH)/.installed
	mkdir -p $(BENCH)/no-cuda
	CUDA_PATH=$(CURDIR)/$(BENCH)/no-cuda $(BENCH)/bin/python -m pip install --quiet 'jax==0.10.2' cython 'mpi4jax==0.9.1'
	touch $@

# jax_ext's per-call cost against jax.lax's own CPU collectives (Gloo), on jax 0.10 and on the newest; then
# jax_ext, mpi4jax and lax.psum side by side on the same MPI processes (benchmarks/jax_three.py)
bench-jax: $(STAMP) $(JAX_VENV)/.installed $(BENCH)/.mpi4jax
	$(PY) benchmarks/jax_overhead.py --repeats 5 --out docs/bench
	$(JAX_VENV)/bin/python benchmarks/jax_overhead.py --repeats 5 --out docs/bench/jax-newest
	mpirun --allow-run-as-root --oversubscribe -np 2 $(BENCH)/bin/python benchmarks/jax_three.py --repeats 3 \
		--out docs/bench/jax-three

lint: $(STAMP)
	$(PY) -m ruff check aioccl jax_ext tests examples benchmarks

clean:
	rm -rf $(VENV) $(JAX_VENV) *.egg-info .pytest_cache .ruff_cache .mypy_cache site dist
