#!/usr/bin/env bash
# The headline figures of docs/heads.md and the README, as the tool prints them on the default seed, and
# the pictures those docs show: run it after a change to interp/, the model or training, then copy what
# changed into the docs (docs/heads.md names this script). A few minutes on two CPU cores; the last digits
# of a figure depend on the CPU kind (bf16 or fp32 matrix units), so the docs name the machine.
#
#     bash tools/heads_figures.sh [OUT]          # OUT: where the runs go (default out/figures)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/figures}
words=docs/heads/words.jsonl
run() { echo; echo "\$ $*"; "$@"; }

# the induction model (configs/induction.yaml: log.circuits draws circuits_training.png)
run python train.py induction train.out_dir="$out/induction"
run python heads.py "$out/induction"                                  # role scores
run python heads.py "$out/induction" --ablate --group L1H0,L1H1,L1H2,L1H3 --group L0H0,L0H1 --sequences 16
run python heads.py "$out/induction" --composition
run python heads.py "$out/induction" --circuit
run python heads.py "$out/induction" --discover
cp "$out/induction/heads/discovered.png" docs/heads/discovered_induction.png
cp "$out/induction/circuits_training.png" docs/heads/circuits_training_induction.png
run python heads.py "$out/induction" --discover --ablation mean --out "$out/induction/heads-mean"
run python heads.py "$out/induction" --discover --ablation zero --out "$out/induction/heads-zero"
# the default Shakespeare model and the word task
run python train.py train.out_dir="$out/shakespeare_char"
run python heads.py "$out/shakespeare_char"
run python heads.py "$out/shakespeare_char" --discover "$words"
cp "$out/shakespeare_char/heads/discovered.png" docs/heads/discovered_words.png
run python heads.py "$out/shakespeare_char" --discover previous-token --out "$out/shakespeare_char/heads-prev"
