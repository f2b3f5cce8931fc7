#!/usr/bin/env bash
# The GPU table of docs/performance.md in one run (issue: "a private step that costs what its arithmetic costs").
#
# On a machine with one CUDA GPU, from the repository root, after `make .venv/.installed`:
#     bash benchmarks/gpu_table.sh            # about 10 minutes on an H100-class card
# It writes results/dp_overhead_gpu.json (the private step: ghost, non-private and Opacus's ghost mode, 5
# interleaved rounds) and results/lightning_overhead_gpu.json (whole Trainer.fit steps, ghost against non-private),
# then prints both tables. Run `make results` afterwards to render them into the docs.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
"$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "no CUDA device: this script measures the GPU table")'
CASES=(resnet18/b64 resnet18/b256 vit_tiny/b64 vit_tiny/b256 cnn_tanh/b256)
"$PYTHON" benchmarks/dp_overhead.py --device cuda --cases "${CASES[@]}" --modes non-DP ghost "Opacus ghost" \
    --rounds 5 --steps 10 --result-name dp_overhead_gpu
"$PYTHON" benchmarks/lightning_overhead.py --accelerator cuda --cases "${CASES[@]}" --engine ghost \
    --pairs 3 --steps 30 --warmup 5 --result-name lightning_overhead_gpu
