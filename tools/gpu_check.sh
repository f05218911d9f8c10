#!/bin/bash
# The GPU check, as two short runs for a GPU machine lent by the minute (each under 10 minutes, both together
# about 12 on one H200 including its start; at most 4 small files each in $OUT, every figure also on stdout):
#
#   bash tools/gpu_check.sh 1   # the CUDA code paths: tests/test_cuda.py (bf16, fp16 + GradScaler, compile,
#                               # CUDA graphs, pinned batches, steps that never wait for the host, attention
#                               # and KV cache) and train.py end to end                           (~4 min)
#   bash tools/gpu_check.sh 2   # GPT-2 small (124M) as configs/gpt2.yaml trains it: batch 32 x 1024 tokens,
#                               # 16 micro-steps, 524,288 tokens per step; eager vs compiled in one tools/bench.py
#                               # process, then train.py's own loop; sampling; memory      (~6-7 min)
#
# Prepare on a machine with internet (the GPU machine may have none), and copy these git-ignored folders along:
#   python prepare.py shakespeare          # data/shakespeare: GPT-2 BPE tokens standing in for FineWeb-Edu
#                                          # (throughput does not depend on the text)
#   pip wheel --no-deps -w wheels omegaconf antlr4-python3-runtime==4.9.3   # if the GPU machine lacks them
# No checkpoint is written (train.save=false); compiles are two (bench's compiled setup, then train.py, which
# finds inductor's cache warm), and CUDA graphs run only inside the tests (gpt2.yaml accumulates gradients,
# which CUDA graphs cannot).
set -uo pipefail
PART=${1:?usage: bash tools/gpu_check.sh 1|2}
OUT=${OUT:-bench/gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 WANDB_MODE=offline
if ! $PY -c "import omegaconf" 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps --find-links "${WHEELS:-wheels}" omegaconf antlr4-python3-runtime
fi
G=(gpt2 data.dataset=shakespeare)  # gpt2.yaml as it is, on the stand-in data
quiet() { grep -v -E "resource_tracker|warnings.warn"; }  # multiprocessing's notes about the memory probe

if [ "$PART" = 1 ]; then
    echo "== machine"
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
      $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(),
'capability', torch.cuda.get_device_capability(), 'bf16', torch.cuda.is_bf16_supported(including_emulation=False))"
    } 2>&1 | tee "$OUT/machine.txt"
    echo "== CUDA code paths (tests/test_cuda.py)"
    $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py --durations=5 2>&1 | tail -25 | tee "$OUT/cuda_tests.txt"
elif [ "$PART" = 2 ]; then
    echo "== 124M as gpt2.yaml trains it: eager (A) vs compiled (B), alternating rounds"
    $PY -m tools.bench "${G[@]}" train.compile=false --compare train.compile=true --only train --warmup 3 --steps 2 \
        --rounds 3 --json "$OUT/gpt2_train.json" 2>&1 | quiet
    echo "== train.py's own loop: 40 iterations of gpt2.yaml, tokens/s every 10 (evals at 0 and 40, no checkpoint)"
    $PY train.py "${G[@]}" train.max_iters=40 train.eval_interval=40 train.save=false log.interval=10 \
        train.out_dir=/tmp/tinygpt_gpu_check 2>&1 | grep -E "^(model|device|iter|done|error)" \
        | tee "$OUT/gpt2_train_py.txt"
    echo "== sampling against the memory-bandwidth floor: eager, compiled (CUDA graphs), int8, 8 samples"
    $PY -m tools.bench "${G[@]}" train.compile=true --only sample --sample-tokens 500 --json "$OUT/gpt2_sample.json" \
        2>&1 | quiet
    echo "== training memory at batch 1 as the context grows (eager)"
    $PY -m tools.bench "${G[@]}" train.compile=false --only memory --json "$OUT/gpt2_memory.json" 2>&1 | quiet
else
    echo "usage: bash tools/gpu_check.sh 1|2" >&2
    exit 2
fi
