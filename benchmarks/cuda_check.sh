#!/usr/bin/env bash
# The CUDA checks, as one script for a lent GPU (the device tool's nvidia-h200: python3 there holds CUDA
# PyTorch, transformers and pytest; nothing is installed). From the repository root:
#     bash benchmarks/cuda_check.sh
# It runs the CUDA graph tests (tests/test_cuda_graph.py: real CUDA graphs against eager decoding on the
# GPU; the CPU cases too) and benchmarks/cuda_graph_speed.py, and leaves both outputs in $OUT (or /tmp).
set -uo pipefail
export PYTHONPATH=src:tests KVADMIT_PURE_PYTHON=1 PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda_graph.py tests/test_cuda_graph_sizes.py 2>&1 \
    | tee "$out/cuda_tests.txt"
python3 benchmarks/cuda_graph_speed.py 2>&1 | tee "$out/cuda_graph_speed.txt"
