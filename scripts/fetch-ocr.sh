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
declare -A MEMBER=(
  [det.onnx]="$INNER_DIR/ch_PP-OCRv4_det_infer.onnx"
  [rec.onnx]="$INNER_DIR/ch_PP-OCRv4_rec_infer.onnx"
)
declare -A FILE_SHA256=(
  [det.onnx]="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"
  [rec.onnx]="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"
)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/wheel.sh
source "$ROOT/scripts/lib/wheel.sh"
fetch_from_wheel fetch-ocr "${MODERATO_MODELS_DIR:-$ROOT/models}/ppocr" \
  "$PACKAGE" "$VERSION" "$WHEEL" "$WHEEL_SHA256" MEMBER FILE_SHA256
