#!/bin/bash
# The GPU check of issue 3 (item 5), as one script for a lent GPU machine (the `device` tool's `run`):
#   1. the CUDA code paths (tests/test_cuda.py: bf16, fp16 + GradScaler, compile, CUDA graphs, pinned batches,
#      attention and KV cache on the GPU);
#   2. GPT-2 small (configs/gpt2.yaml, 124M) training speed and MFU against the GPU's bf16 peak, eager vs
#      compiled in one bench.py run, and with CUDA graphs;
#   3. a few hundred real training steps of 124M through train.py.
# Data: the `shakespeare` BPE dataset (prepare it here first: python -m data.prepare shakespeare) stands in for
# FineWeb-Edu, which the machine cannot download; throughput does not depend on the text.
# Usage: the device tool's run, command "bash tools/gpu_check.sh", carry ["data/shakespeare", "wheels"],
# where wheels/ holds what the GPU image lacks: pip download omegaconf -d wheels
set -uo pipefail
OUT=${OUT:-bench/gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
$PY -c "import omegaconf" 2>/dev/null || $PY -m pip install -q --no-index --find-links wheels omegaconf
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
export WANDB_MODE=offline TIKTOKEN_CACHE_DIR=${TIKTOKEN_CACHE_DIR:-$PWD/../shared/tiktoken-cache}
G="data.dataset=shakespeare train.grad_accum=1 train.batch_size=16"
echo "== CUDA paths"; $PY -m pytest -q tests/test_cuda.py 2>&1 | tail -5 | tee "$OUT/cuda_tests.txt"
echo "== 124M eager vs compiled"
$PY bench.py gpt2 $G train.compile=false --compare train.compile=true --only train --steps 10 --rounds 3 \
    --json "$OUT/gpt2_compile.json" 2>&1 | tail -6
echo "== 124M compiled vs compiled + CUDA graphs"
$PY bench.py gpt2 $G train.compile=true --compare train.compile_mode=reduce-overhead --only train --steps 10 \
    --rounds 3 --json "$OUT/gpt2_graphs.json" 2>&1 | tail -6
echo "== sampling and memory"
$PY bench.py gpt2 $G --only sample,memory --json "$OUT/gpt2_sample_memory.json" 2>&1 | tail -12
echo "== 300 steps of train.py"
$PY train.py gpt2 $G train.out_dir="$OUT/run" train.overwrite=true train.max_iters=300 train.eval_interval=300 \
    train.eval_iters=10 optim.warmup_iters=30 2>&1 | tr '\r' '\n' | grep -v "^\s*$" | tail -8
