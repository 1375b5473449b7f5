# Everything the book needs, bootstrapped into .venv on first use.
# Python 3.12: the first interpreter that really is 3.12 (a pyenv shim may exist and refuse to run).
PY312 := $(firstword $(foreach p,python3.12 $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12),\
  $(shell $(p) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null && echo $(p))))
PYTHON ?= $(PY312)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The local Slurm cluster of `make cluster`: while its state folder exists, every target (the
# chapters, the tests, the lab) reaches it, as a cluster's own machines reach theirs.
CLUSTER_DIR ?= $(CURDIR)/.cluster
ifneq ($(wildcard $(CLUSTER_DIR)/slurm.conf),)
export SLURM_CONF := $(CLUSTER_DIR)/slurm.conf
endif

.PHONY: cluster cluster-down book test test-floor test-colab bench bench-gpu serve lab lint clean check-dot

$(STAMP): requirements.txt pyproject.toml
	@test -n "$(PYTHON)" || { echo "Python 3.12 is needed: install it (python.org, 'apt-get install python3.12', 'pyenv install 3.12') or run 'make PYTHON=/path/to/python3.12'."; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

check-dot:
	@command -v dot >/dev/null || echo "note: Graphviz's 'dot' is missing, so diagrams fall back to text; install it with 'sudo apt-get install graphviz' (Debian/Ubuntu) or 'brew install graphviz' (macOS)."

book: $(STAMP) check-dot
	$(BIN)/jupyter-book build . --warningiserror --keep-going

# Every chapter an nbmake item (tests/conftest.py runs each on a copy, kept for the book build,
# and puts them first). --no-loadscope-reorder keeps that order, so both workers execute chapters
# before one builds the book from them, rather than one waiting with the book's large group.
test: $(STAMP) check-dot
	$(BIN)/pytest -n 2 --dist loadgroup --no-loadscope-reorder --durations=10 --nbmake notebooks tests

# Every chapter alone in an empty folder, the package installed --no-deps beside pyproject's
# dependencies only, as Colab and Kaggle run it: on the oldest jax the book supports (with
# ipywidgets 7, which Colab kept for years), and on the pinned newest jax.
test-floor: $(STAMP) check-dot
	$(BIN)/python tests/colab_run.py --venv .venv-floor --jax floor --ipywidgets 7.7.1

test-colab: $(STAMP) check-dot
	$(BIN)/python tests/colab_run.py --venv .venv-colab --jax pinned

bench: $(STAMP) check-dot
	$(BIN)/python benchmarks/bench.py --out BENCHMARKS.md

# One accelerator's numbers for chapters 12, 17 and 18, into book/measurements/ (see
# benchmarks/bench_gpu.py). On a machine whose Python already has a CUDA or TPU jax and no
# network: make bench-gpu PY=python3. DRY=1: the same code on the CPU at tiny sizes.
bench-gpu: $(if $(PY),,$(STAMP))
	$(or $(PY),$(BIN)/python) benchmarks/bench_gpu.py $(if $(DRY),--dry,--keep book/measurements)

serve: book
	$(BIN)/python -m http.server --directory _build/html 8000

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tests/nbconventions.py notebooks

# Two Slurm nodes on this machine (root; installs Debian's slurm-wlm and munge when missing).
cluster:
	CLUSTER_DIR=$(CLUSTER_DIR) bash cluster/local_slurm.sh up

cluster-down:
	CLUSTER_DIR=$(CLUSTER_DIR) bash cluster/local_slurm.sh down

clean:
	rm -rf _build .jupyter_cache .pytest_cache
	find . -name __pycache__ -not -path './$(VENV)/*' -exec rm -rf {} +
