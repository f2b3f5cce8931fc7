PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-gpu lint bench docs clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	WANDB_MODE=offline $(BIN)/python -m lightning_dprobust.demo

.PHONY: demo-ehr
demo-ehr: $(STAMP)
	WANDB_MODE=offline $(BIN)/python -m lightning_dprobust.demo_ehr

test: $(STAMP)
	WANDB_MODE=offline $(BIN)/python -m pytest -q
	WANDB_MODE=offline $(BIN)/python -m pytest -q --doctest-modules lightning_dprobust

test-slow: $(STAMP)
	WANDB_MODE=offline $(BIN)/python -m pytest -q -m slow

test-gpu: $(STAMP)
	WANDB_MODE=offline $(BIN)/python -m pytest -q -m gpu

lint: $(STAMP)
	$(BIN)/ruff check lightning_dprobust tests benchmarks

docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(BIN)/python benchmarks/dp_overhead.py

# docs tables between <!-- results:NAME --> markers, rendered from results/NAME.json (the benchmarks write those)
.PHONY: results results-check
results: $(STAMP)
	$(BIN)/python benchmarks/render_results.py

results-check: $(STAMP)
	$(BIN)/python benchmarks/render_results.py --check

clean:
	rm -rf $(VENV) runs wandb lightning_logs site
