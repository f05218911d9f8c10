#!/bin/bash
# The GPU check: one run of at most 5 minutes on one GPU (an H200 lent by the minute, compilation included),
# prepared here and rehearsed on the CPU.
#
#   bash tools/gpu_check.sh prepare                 # here: what the GPU machine lacks
#   bash tools/gpu_check.sh                         # there: the check; figures in $OUT (bench/gpu_check)
#   GPU_CHECK_DEVICE=cpu bash tools/gpu_check.sh    # the rehearsal: the same steps on the CPU, small sizes
#   bash tools/gpu_check.sh --dry-run               # each step's command and time budget, nothing run
#   bash tools/gpu_check.sh --help                  # this text
#
# prepare writes two git-ignored folders (about 2 MB), then prints what would travel with them and the list
# to take along (a `carry` list); datasets and wandb, which a bare image lacks, are imported only where used:
#   data/shakespeare/  tiny Shakespeare as GPT-2 BPE tokens, standing in for FineWeb-Edu (speed does not
#                      depend on the text): gpt2.yaml trains on it with data.dataset=shakespeare
#   tiktoken-cache/    GPT-2's BPE ranks (tiktoken's r50k_base), for a machine that cannot download them
#
# The check's steps, the most valuable first. Each prints its command (copy it to run the step alone) and
# its figures as soon as they exist; $OUT/log.txt keeps everything, so a run cut at its limit still reports
# what it measured. Each step has a time budget and the run a deadline (GPU_CHECK_SECONDS): a slow step is
# stopped, and the steps after it still run. $OUT gets at most 8 files, none in a folder.
#   gpu, versions  nvidia-smi (is anything else on the GPU?); the GPU, driver, Python, torch, packages
#   tests       tests/test_cuda.py: bf16, fp16 + GradScaler, torch.compile, CUDA graphs, pinned batches, steps
#               that never wait for the host, windowed and document attention, KV caches, train.py
#   gpt2        GPT-2 124M as configs/gpt2.yaml trains it (32 x 1024 tokens, 16 micro-steps: 524,288 tokens
#               an iteration), compiled: ms/iteration, tokens/s, MFU (of the data sheet's bf16 peak), memory
#   train.py    train.py's own loop on the same config, 24 iterations: tokens/s every 4, evals at 0 and 24
#   sample      decoding against the memory-bandwidth floor: fp32, int8, 8 samples, nanoGPT's generator
#   attention   a window of 256 (in blocks) against full causal attention, forward + backward, T to 16,384
#   and if time is left: eager (gpt2 without compiling: what the compile buys), compiled (sampling compiled)
#
# Environment: GPU_CHECK_DEVICE (cuda, or cpu for the rehearsal), GPU_CHECK_SECONDS (the deadline: 285 on a
# GPU, 840 on the CPU), OUT (default bench/gpu_check), PYTHON (default python3). The rehearsal passes under a
# Python that has only what the GPU image has (torch, numpy, tiktoken, tokenizers, safetensors, pyyaml,
# matplotlib, tqdm, pytest; no datasets or wandb): docs/gpu.md says how to run it.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DATA=data/shakespeare
VOCAB=tiktoken-cache
CARRY=("$DATA" "$VOCAB")

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

show() {  # a command as one line to copy: arguments quoted only where the shell needs it
    local a out=()
    for a in "$@"; do
        if [[ $a =~ ^[][A-Za-z0-9_./=:,@%+-]+$ ]]; then out+=("$a"); else out+=("'${a//\'/\'\\\'\'}'"); fi
    done
    echo "\$ ${out[*]}"
}

# --- prepare: here, where the corpus and GPT-2's BPE ranks are at hand ---

prepare() {
    set -e
    echo "== GPT-2's BPE ranks into $VOCAB/"
    mkdir -p "$VOCAB"
    local have=${TIKTOKEN_CACHE_DIR:-../shared/tiktoken-cache}  # a cache at hand (the project's shared one)
    if [ -d "$have" ] && [ "$(cd "$have" && pwd)" != "$(cd "$VOCAB" && pwd)" ]; then
        cp -pR "$have"/. "$VOCAB"/
    fi  # else tiktoken downloads the ranks here
    TIKTOKEN_CACHE_DIR=$PWD/$VOCAB $PY -c \
        "import tiktoken; print('r50k_base:', tiktoken.get_encoding('r50k_base').n_vocab, 'tokens')"
    echo "== the stand-in data into $DATA/"
    TIKTOKEN_CACHE_DIR=$PWD/$VOCAB $PY prepare.py shakespeare
    local files carried total  # bytes: the checkout's files (tracked, or untracked but not ignored); ours
    files=$({ git ls-files -z --cached --others --exclude-standard || true; } | xargs -0 -r du -cb -- |
        tail -1 | cut -f1)
    carried=$(du -scb "${CARRY[@]}" | tail -1 | cut -f1)
    total=$((${files:-0} + carried))
    echo "== ready"
    echo "what travels: the checkout's files $((${files:-0} / 1024)) KiB + these folders" \
        "$((carried / 1024)) KiB = $((total / 1024)) KiB"
    ((total > 64 * 1048576)) && echo "warning: over the 64 MiB a lent GPU machine takes along"
    local list
    list=$(printf '"%s", ' "${CARRY[@]}")
    echo "take along (carry): [${list%, }]"
    echo "then, on the GPU machine: bash tools/gpu_check.sh   (5 minutes; figures in \$OUT)"
}

# --- the check ---

SUMMARY=()
FAILED=0
step() {  # step NAME BUDGET core|extra COMMAND...: run it within its budget and what is left of the deadline
    local name=$1 budget=$2 kind=$3 left rc start
    shift 3
    left=$((DEADLINE - SECONDS))
    if [ -n "$DRY" ]; then
        echo "== $name (at most $budget s$([ "$kind" = extra ] && echo ", if time is left"))"
        show "$@"
        return
    fi
    if ((left < MIN_STEP)); then
        echo "== $name: skipped, $left s left of $DEADLINE"
        SUMMARY+=("$(printf '%-10s skipped: %s s left' "$name" "$left")")
        [ "$kind" = core ] && FAILED=1
        return
    fi
    ((budget > left)) && budget=$left
    echo
    echo "== $name (at most $budget s; $SECONDS s so far)"
    show "$@"
    start=$SECONDS
    timeout --kill-after=10 "$budget" "$@"
    rc=$?
    if ((rc == 0)); then
        SUMMARY+=("$(printf '%-10s ok, %s s' "$name" $((SECONDS - start)))")
        return
    fi
    if ((rc == 124 || rc == 137)); then
        rc="stopped at its budget, $budget s"
        [ "$kind" = core ] && FAILED=1  # an extra step cut short is only a figure missing
    else
        rc="failed (exit $rc)"
        FAILED=1
    fi
    echo "== $name: $rc"
    SUMMARY+=("$(printf '%-10s %s' "$name" "$rc")")
}

headline() {  # the main figures again, from the JSON files: the end of a long log is what a reader sees first
    $PY - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def rows(name, key):
    f = out / name
    return json.loads(f.read_text()).get(key, []) if f.is_file() else []
for name, label in (("gpt2_train.json", "gpt2 compiled"), ("gpt2_train_eager.json", "gpt2 eager")):
    for r in rows(name, "train"):
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        print(f"{label}: {r['ms_per_iter']:,} ms/iteration, {r['tokens_per_s']:,} tokens/s, MFU {mfu}, "
              f"peak memory {r['peak_mem_MB']} MB, {r['precision']} on {r['device']}")
for r in rows("sample.json", "sample_floor"):
    print(f"sampling: the floor {r['floor_tok_s']:,} tokens/s ({r['weights_MB_per_token']} MB a token at "
          f"{r['read_GB_s']} GB/s read)")
compiled = [r for r in rows("sample_compiled.json", "sample") if r["compile_s"]]
for r in rows("sample.json", "sample") + compiled:
    print(f"  {r['path']}: {r['tok_s']:,} tokens/s, {r['of_floor']} of the floor")
attention = rows("attention.json", "attention")
for path in dict.fromkeys(r["path"] for r in attention if r["path"] != "full causal"):
    r = [r for r in attention if r["path"] == path][-1]
    print(f"attention at T={r['context']:,}, {path}: {r['time_vs_full']} x the time of full causal, "
          f"{r['memory_vs_full']} x its memory")
EOF
}

sizes() {  # the steps' arguments on this device: gpt2.yaml as it is on a GPU; on the CPU, a size two cores
    # run in seconds, on the same data and vocabulary
    RUN_DIR=${TMPDIR:-/tmp}/tinygpt_gpu_check_run
    G=(gpt2 "data.dataset=shakespeare" "train.device=$DEVICE") X=()
    if [ "$DEVICE" = cuda ]; then
        DEADLINE=${GPU_CHECK_SECONDS:-285} MIN_STEP=20
        T=(--warmup 3 --steps 2 --rounds 3)  # 6 timed iterations; the compile happens in the first
        I=(train.max_iters=24 train.eval_interval=24 log.interval=4)
        S=(--sample-tokens 200 --rounds 3)
        A=(--rounds 3)
        BUDGET=(20 20 120 120 100 45 40 45 60)  # seconds per step, in the order of steps()
    elif [ "$DEVICE" = cpu ]; then
        DEADLINE=${GPU_CHECK_SECONDS:-840} MIN_STEP=30
        G+=(model.n_layer=2 model.n_head=2 model.n_embd=64 model.block_size=128 train.batch_size=4
            train.grad_accum=2 train.eval_iters=2)
        T=(--warmup 2 --steps 2 --rounds 2)
        I=(train.max_iters=24 train.eval_interval=24 log.interval=4)
        S=(--sample-tokens 32 --rounds 2)
        A=(--rounds 2 --contexts 256,512,1024)
        BUDGET=(0 30 90 240 180 90 60 60 240)
    else
        echo "error: GPU_CHECK_DEVICE is cuda or cpu, got $DEVICE" >&2
        exit 2
    fi
    # pytest-xdist where it is installed (the GPU image has it): the tests' compiles side by side
    $PY -c "import xdist" 2>/dev/null && X=(-n "$([ "$DEVICE" = cuda ] && echo 4 || echo 2)")
}

steps() {
    local bench=("$PY" -m tools.bench "${G[@]}")
    [ "$DEVICE" = cuda ] && step gpu "${BUDGET[0]}" core nvidia-smi
    step versions "${BUDGET[1]}" core "$PY" -m tools.versions
    step tests "${BUDGET[2]}" core "$PY" -m pytest -v -p no:cacheprovider "${X[@]}" --durations=10 \
        tests/test_cuda.py
    step gpt2 "${BUDGET[3]}" core "${bench[@]}" train.compile=true --only train "${T[@]}" \
        --json "$OUT/gpt2_train.json"
    [ -z "$DRY" ] && rm -rf "$RUN_DIR"  # no metrics of an earlier run
    step train.py "${BUDGET[4]}" core "$PY" train.py "${G[@]}" train.compile=true "${I[@]}" train.save=false \
        log.plot=false "train.out_dir=$RUN_DIR"
    [ -z "$DRY" ] && [ -f "$RUN_DIR/metrics.jsonl" ] && cp "$RUN_DIR/metrics.jsonl" "$OUT/train_py.jsonl"
    step sample "${BUDGET[5]}" core "${bench[@]}" train.compile=false --only sample "${S[@]}" \
        --json "$OUT/sample.json"
    step attention "${BUDGET[6]}" core "$PY" -m tools.bench "train.device=$DEVICE" --only attention \
        "${A[@]}" --json "$OUT/attention.json" --plot "$OUT/attention_cost.png"
    step eager "${BUDGET[7]}" extra "${bench[@]}" train.compile=false --only train "${T[@]}" \
        --json "$OUT/gpt2_train_eager.json"
    step compiled "${BUDGET[8]}" extra "${bench[@]}" train.compile=true --only sample "${S[@]}" \
        --json "$OUT/sample_compiled.json"
    [ -n "$DRY" ] && return 0
    echo
    echo "== headline figures"
    headline
    echo
    echo "== summary: $SECONDS s of $DEADLINE; in $OUT: $(ls "$OUT" | tr '\n' ' ')"
    printf '%s\n' "${SUMMARY[@]}"
    return $FAILED
}

check() {
    DEVICE=${GPU_CHECK_DEVICE:-cuda}
    OUT=${OUT:-bench/gpu_check}
    sizes
    [ -n "$DRY" ] && { steps; return; }
    if [ ! -f "$DATA/train.bin" ]; then
        echo "error: $DATA is not prepared: run 'bash tools/gpu_check.sh prepare' first and take it along" >&2
        exit 2
    fi
    mkdir -p "$OUT"
    export PYTHONUNBUFFERED=1 WANDB_MODE=offline
    [ -d "$VOCAB" ] && export TIKTOKEN_CACHE_DIR=$PWD/$VOCAB  # the machine may not reach tiktoken's server
    {
        echo "tinygpt GPU check on $DEVICE, $(date -u '+%Y-%m-%d %H:%M UTC'), commit" \
            "$(git rev-parse --short HEAD 2>/dev/null || echo unknown); deadline $DEADLINE s"
        steps
    } 2>&1 | tee "$OUT/log.txt"  # every line also in $OUT/log.txt as it comes
    return "${PIPESTATUS[0]}"
}

DRY=""
case "${1:-}" in
    prepare) prepare ;;
    "") check ;;
    --dry-run)
        DRY=1
        check
        ;;
    -h | --help | help) usage ;;
    *)
        usage >&2
        exit 2
        ;;
esac
