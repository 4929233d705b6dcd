#!/usr/bin/env bash
# Measures the shipped heads on every set in ../shared/datasets/{eval,restricted} (beside the repository)
# and on the held-out split, next to alt-profanity-check; writes eval/REPORT.md
# and eval/pr_*.png, then the second stage's eval/REPORT-second-stage.md. Needs the prepared data of scripts/train-text-model.sh
# (it runs the preparation step itself when missing).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

"$ROOT/scripts/fetch-minilm.sh"
"$ROOT/scripts/fetch-e5.sh"
if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
.venv/bin/pip install --quiet -r train/requirements.txt
cargo build --quiet --example embed --example lexical_features --example embed_e5

cd train
[[ -f out/dataset.jsonl ]] || ../.venv/bin/python prepare.py
../.venv/bin/python evaluate.py
# The second stage (text_model.second_stage), beside the default heads just measured.
MODERATO_HEADS_FILE=../assets/text-model/heads-e5.json MODERATO_REPORT=second-stage \
  MODERATO_BEFORE=../eval/metrics.json ../.venv/bin/python evaluate.py
echo "evaluate-text-model: wrote eval/REPORT.md and eval/REPORT-second-stage.md"
