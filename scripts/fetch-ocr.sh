#!/usr/bin/env bash
# Fetches PaddleOCR's PP-OCRv4 text detector and recogniser (Apache-2.0), as
# ONNX, from the PyPI package that ships them (rapidocr-onnxruntime), verifies
# every byte against pinned checksums and installs them into
# "${MODERATO_MODELS_DIR:-<repo>/models}/ppocr/".
#
# The wheel's files are kept in ppocr/source/; what the service loads,
# ppocr/{det,rec}.onnx, is each rewritten by scripts/fuse-ocr.py (the same
# arithmetic in fewer passes over memory: 1.7 times faster on two cores),
# run with the pinned onnx and numpy of scripts/fuse-ocr-requirements.txt in a
# throwaway virtual environment, and checked against its own pin.
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

# installed name -> name inside the wheel, and installed name -> sha256 of the
# wheel's file.
declare -A MEMBER=(
  [det.onnx]="$INNER_DIR/ch_PP-OCRv4_det_infer.onnx"
  [rec.onnx]="$INNER_DIR/ch_PP-OCRv4_rec_infer.onnx"
)
declare -A FILE_SHA256=(
  [det.onnx]="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"
  [rec.onnx]="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"
)

# installed name -> sha256 after scripts/fuse-ocr.py (the same pins are in
# src/moderation/image/ocr, which checks them again at load).
declare -A FUSED_SHA256=(
  [det.onnx]="73c1e265a77131df4851356811d09e21f53765dd1faf19f299463de7d50bb57c"
  [rec.onnx]="a72181818db1a0656453a6c1244696955b5ac72474dd791a1397085c809df700"
)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/wheel.sh
source "$ROOT/scripts/lib/wheel.sh"
DEST="${MODERATO_MODELS_DIR:-$ROOT/models}/ppocr"
if files_verify "$DEST" FUSED_SHA256; then
  echo "fetch-ocr: $DEST is up to date"
  exit 0
fi
# In a subshell: the routine's clean-up trap then fires when it returns.
(fetch_from_wheel fetch-ocr "$DEST/source" \
  "$PACKAGE" "$VERSION" "$WHEEL" "$WHEEL_SHA256" MEMBER FILE_SHA256)

FETCH_TAG=fetch-ocr
python="${PYTHON:-python3}"
work="$(mktemp -d)"
trap "rm -rf '$work'" EXIT
"$python" -m venv "$work/venv" || die "$python cannot make a virtual environment (install python3-venv)"
"$work/venv/bin/pip" install --quiet --require-hashes --only-binary=:all: \
  -r "$ROOT/scripts/fuse-ocr-requirements.txt" ||
  die "could not install scripts/fuse-ocr-requirements.txt (is PyPI reachable? CPython 3.11 on x86-64 Linux is needed)"
for name in "${!FUSED_SHA256[@]}"; do
  "$work/venv/bin/python" "$ROOT/scripts/fuse-ocr.py" "$DEST/source/$name" "$work/$name" ||
    die "scripts/fuse-ocr.py failed on $name"
  actual="$(sha256_of "$work/$name")"
  [[ "$actual" == "${FUSED_SHA256[$name]}" ]] ||
    die "checksum mismatch for the rewritten $name: expected ${FUSED_SHA256[$name]}, got $actual"
done
for name in "${!FUSED_SHA256[@]}"; do
  mv -f "$work/$name" "$DEST/$name"
done
files_verify "$DEST" FUSED_SHA256 || die "files in $DEST do not verify after install"
echo "fetch-ocr: installed the rewritten ${!FUSED_SHA256[*]} into $DEST"
