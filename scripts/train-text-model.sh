#!/usr/bin/env bash
# Reproduces assets/text-model/heads.json and ngrams.bin from ../shared/datasets/train (beside the repository) and
# train/data: fetches the encoder, builds the `embed` example (the same Rust
# code that serves), prepares the data, trains, calibrates and picks
# thresholds. Scratch files go to train/out/ (git-ignored).
# Usage: scripts/train-text-model.sh   (MODERATO_DATASETS overrides the datasets folder)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

"$ROOT/scripts/fetch-minilm.sh"
"$ROOT/scripts/fetch-e5.sh"

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
.venv/bin/pip install --quiet -r train/requirements.txt

cargo build --quiet --example embed --example lexical_features --example ngram_terms --example embed_e5

cd train
../.venv/bin/python prepare.py
../.venv/bin/python train_ngrams.py
../.venv/bin/python train_heads.py
echo "train-text-model: done; run scripts/evaluate-text-model.sh for the report"
