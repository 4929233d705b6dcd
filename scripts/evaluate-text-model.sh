#!/usr/bin/env bash
# Measures the shipped heads on every set in ../shared/datasets/{eval,restricted} (beside the repository)
# and on the held-out split, next to alt-profanity-check: the fast path's heads
# (eval/REPORT-fast.md) and then the default, accurate path's (eval/REPORT.md, the fast
# heads as its "before"), with eval/pr_*.png. Needs the prepared data of scripts/train-text-model.sh
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
MODERATO_REPORT=fast ../.venv/bin/python evaluate.py
# The default, accurate path (both encoders), beside the fast heads just measured.
MODERATO_HEADS_FILE=../assets/text-model/heads-e5.json \
  MODERATO_BEFORE=../eval/metrics-fast.json ../.venv/bin/python evaluate.py
echo "evaluate-text-model: wrote eval/REPORT-fast.md and eval/REPORT.md"
