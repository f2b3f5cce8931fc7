PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-gpu lint bench clean

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

test-slow: $(STAMP)
	WANDB_MODE=offline $(BIN)/python -m pytest -q -m slow

test-gpu: $(STAMP)
	WANDB_MODE=offline $(BIN)/python -m pytest -q -m gpu

lint: $(STAMP)
	$(BIN)/ruff check lightning_dprobust tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/dp_overhead.py

clean:
	rm -rf $(VENV) runs wandb lightning_logs
