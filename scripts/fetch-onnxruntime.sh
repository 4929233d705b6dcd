#!/usr/bin/env bash
# Fetches the ONNX Runtime library (MIT licence) that runs the OCR models,
# from the PyPI wheel of onnxruntime, verifies the wheel and the library
# against pinned checksums and installs the library as
# "${MODERATO_MODELS_DIR:-<repo>/models}/onnxruntime/libonnxruntime.so.1.32.0",
# beside its licence. The service loads it from there at start (the `ort`
# crate's load-dynamic); nothing is linked at build time.
#
# The wheel is pinned exactly (CPython 3.11, manylinux_2_28 x86_64: glibc
# 2.28 or newer, e.g. Debian bookworm), whatever Python runs pip: the library
# inside is a plain C API library that does not use Python.
#
# Idempotent: when the library is present and its checksum matches, it does
# nothing. Usage: scripts/fetch-onnxruntime.sh
set -euo pipefail

PACKAGE="onnxruntime"
VERSION="1.32.0"
WHEEL="onnxruntime-${VERSION}-cp311-cp311-manylinux_2_28_x86_64.whl"
WHEEL_SHA256="5a34fc4dfeb5a7b4a74c95dcba1e773d722abda720b474edf1b0c419dc6d163d"
LIBRARY="libonnxruntime.so.${VERSION}"
# The same pin is in src/moderation/image/ocr, which checks it again at load.
LIBRARY_SHA256="6c1585d1bbf45b0712ea4a21b705c5fcb4ba04ff2e30f1fbf81a49faf658638f"
declare -A MEMBER=(
  [$LIBRARY]="onnxruntime/capi/$LIBRARY"
  [LICENSE]="onnxruntime/LICENSE"
)
declare -A FILE_SHA256=(
  [$LIBRARY]="$LIBRARY_SHA256"
  [LICENSE]="2f07c72751aed99790b8a4869cf2311df85a860b22ded05fa22803587a48922c"
)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/wheel.sh
source "$ROOT/scripts/lib/wheel.sh"

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) die "the pinned ONNX Runtime library is for Linux x86_64, not $(uname -s)-$(uname -m)" ;;
esac
# The wheel is chosen by its tags, not by the Python that runs pip.
fetch_from_wheel fetch-onnxruntime "${MODERATO_MODELS_DIR:-$ROOT/models}/onnxruntime" \
  "$PACKAGE" "$VERSION" "$WHEEL" "$WHEEL_SHA256" MEMBER FILE_SHA256 \
  --implementation cp --python-version 3.11 --abi cp311 --platform manylinux_2_28_x86_64
