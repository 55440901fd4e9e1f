# gwdet's entry points. Each target installs what it needs first (scripts/setup_env.sh, idempotent).
#   make demo          train + evaluate the demo Mask R-CNN (GW) on the embedded shapes dataset (CPU,
#                      one thread, AVX2 kernels: it prints the numbers of docs/demo.md on an Intel CPU
#                      with AVX2; AMD CPUs have their own row there)
#   make test          the test suite (CPU), in TEST_WORKERS processes (pytest-xdist; default 2, each
#                      computing with one thread: tests/conftest.py)
#   make lint          the linter and the type checker: ruff check . and mypy gwdet (settings in
#                      pyproject.toml); CI runs it after the tests
#   make mutation      mutation testing of the checks (mutmut; scope in pyproject.toml, results
#                      and survivors in docs/reliability.md); about 45 minutes on 2 cores
#   make setup         only create/refresh the virtual environment (.venv)
#   make test-matrix   the suite once per available Python 3.10-3.13 (and detectron2 source), each in
#                      its own environment under .venv-matrix/; run before a release
#   make gpu-check     on a CUDA GPU, at most about 5 minutes: tests/test_cuda.py, every GW plan against GN
#                      and the 3x3 conv, a demo detector's step with and without AMP, the Triton kernels'
#                      resources, the cost model beside it all; a dated section in docs/benchmarks.md
#
# Variables (on the command line or in the environment, both work):
#   PYTHON=python3.12        interpreter that creates a new .venv (default python3; Python 3.10-3.13)
#   VENV=.venv-3.12          where the environment lives (default .venv)
#   D2_SOURCE=path/or/url    build detectron2 from source (gets its compiled _C) instead of the wheel
#   TEST_WORKERS=1           make test in one process (default 2)
#   PYTHONS="3.10 3.12"      test-matrix: the Python versions to try (default: 3.10 3.11 3.12 3.13)
VENV ?= .venv
TEST_WORKERS ?= 2
# The environment's own interpreter; PYTHON is the one that creates it (scripts/setup_env.sh).
VENV_PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.gwdet-installed
DEMO_CONFIG ?= configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml
export PYTHON D2_SOURCE PYTHONS MATRIX_DIR

.PHONY: setup demo test lint mutation test-matrix gpu-check clean-demo

$(STAMP): setup.py pyproject.toml scripts/setup_env.sh requirements/lock.txt
	bash scripts/setup_env.sh $(VENV)
	touch $(STAMP)

# Always runs the (idempotent) set-up script, so it also checks an existing environment.
setup:
	bash scripts/setup_env.sh $(VENV)
	touch $(STAMP)

# One CPU thread, and the CPU kernels of PyTorch, MKL and oneDNN limited to AVX2: the thread count
# and the vector extensions the kernels use (AVX2, AVX-512) change the order of floating-point sums
# and so the result; with both fixed, an Intel CPU with AVX2 gives the numbers of docs/demo.md (an AMD
# CPU its own: MKL's AVX2 branch sums otherwise there).
DEMO_KERNELS = ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
demo: $(STAMP)
	$(DEMO_KERNELS) $(VENV_PYTHON) tools/train_net.py --config $(DEMO_CONFIG) --threads 1

# pytest exits 5 when it collects no test: an empty suite checks nothing, so that fails too.
test: $(STAMP)
	$(VENV_PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=15 tests; status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$status

# Both run, so that one call shows every finding; it fails when either finds something. mypy
# checks the files pyproject.toml names (gwdet/). A crash of mypy itself (exit 2 with "INTERNAL
# ERROR" and its traceback, not a finding about gwdet) is shown and the check runs once more
# without mypy's cache; a second crash fails the target.
lint: $(STAMP)
	status=0; $(VENV)/bin/ruff check . || status=1; \
	out="$$($(VENV)/bin/mypy 2>&1)"; code=$$?; echo "$$out"; \
	if [ $$code -eq 2 ] && echo "$$out" | grep -q "INTERNAL ERROR"; then \
		echo "[lint] mypy crashed (above); checking again without its cache" >&2; \
		$(VENV)/bin/mypy --no-incremental; code=$$?; \
	fi; \
	[ $$code -eq 0 ] || status=1; exit $$status

# mutmut works in a copy of the sources under mutants/ (git-ignored); `mutmut results` lists the
# survivors, `mutmut show NAME` shows one.
mutation: $(STAMP)
	$(VENV)/bin/pip install -q "mutmut>=3.8"
	OMP_NUM_THREADS=1 $(VENV)/bin/mutmut run; status=$$?; $(VENV)/bin/mutmut results; exit $$status

test-matrix:
	bash scripts/test_matrix.sh

# Refuses (exit status 2, nothing written) where torch sees no CUDA GPU.
gpu-check: $(STAMP)
	$(VENV_PYTHON) tools/gpu_check.py --out docs/benchmarks.md

clean-demo:
	rm -rf output/demo
