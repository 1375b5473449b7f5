# Everything the book needs, bootstrapped into .venv on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: book test bench serve lab lint clean check-dot

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

check-dot:
	@command -v dot >/dev/null || echo "note: Graphviz's 'dot' is missing, so diagrams fall back to text; install it with 'sudo apt-get install graphviz' (Debian/Ubuntu) or 'brew install graphviz' (macOS)."

book: $(STAMP) check-dot
	$(BIN)/jupyter-book build . --warningiserror --keep-going

test: $(STAMP) check-dot
	$(BIN)/pytest -n 2 --dist loadgroup --nbmake --nbmake-timeout=300 tests notebooks

bench: $(STAMP) check-dot
	$(BIN)/python benchmarks/bench.py --out BENCHMARKS.md

serve: book
	$(BIN)/python -m http.server --directory _build/html 8000

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tests/nbconventions.py notebooks

clean:
	rm -rf _build .jupyter_cache .pytest_cache
	find . -name __pycache__ -not -path './$(VENV)/*' -exec rm -rf {} +
