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
INNER_LIBRARY="onnxruntime/capi/$LIBRARY"
INNER_LICENSE="onnxruntime/LICENSE"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODELS_DIR="${MODERATO_MODELS_DIR:-$ROOT/models}"
DEST="$MODELS_DIR/onnxruntime"

die() {
  echo "fetch-onnxruntime: error: $*" >&2
  exit 1
}

sha256_of() {
  sha256sum "$1" | cut -d' ' -f1
}

library_ok() {
  [[ -f "$DEST/$LIBRARY" ]] && [[ "$(sha256_of "$DEST/$LIBRARY")" == "$LIBRARY_SHA256" ]]
}

if library_ok && [[ -f "$DEST/LICENSE" ]]; then
  echo "fetch-onnxruntime: $DEST is up to date"
  exit 0
fi

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) die "the pinned ONNX Runtime library is for Linux x86_64, not $(uname -s)-$(uname -m)" ;;
esac
command -v sha256sum >/dev/null || die "sha256sum not found (install coreutils)"
PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found; it is needed for pip and to unpack the wheel"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "pip is not available for $PYTHON (install python3-pip)"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

echo "fetch-onnxruntime: downloading $PACKAGE==$VERSION ($WHEEL) from PyPI"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
  --implementation cp --python-version 3.11 --abi cp311 \
  --platform manylinux_2_28_x86_64 \
  "$PACKAGE==$VERSION" -d "$TMP" ||
  die "pip download of $PACKAGE==$VERSION failed (is PyPI reachable?)"

[[ -f "$TMP/$WHEEL" ]] || die "expected $WHEEL, pip saved: $(ls "$TMP")"
actual="$(sha256_of "$TMP/$WHEEL")"
[[ "$actual" == "$WHEEL_SHA256" ]] ||
  die "checksum mismatch for $WHEEL: expected $WHEEL_SHA256, got $actual"

"$PYTHON" - "$TMP/$WHEEL" "$TMP" "$INNER_LIBRARY" "$INNER_LICENSE" <<'PY' ||
import shutil, sys, zipfile
wheel, out = sys.argv[1:3]
with zipfile.ZipFile(wheel) as z:
    for member in sys.argv[3:]:
        name = member.rsplit("/", 1)[-1]
        with z.open(member) as src, open(f"{out}/{name}", "wb") as dst:
            shutil.copyfileobj(src, dst)
PY
  die "could not extract $INNER_LIBRARY and its licence from $WHEEL"
actual="$(sha256_of "$TMP/$LIBRARY")"
[[ "$actual" == "$LIBRARY_SHA256" ]] ||
  die "checksum mismatch for $LIBRARY: expected $LIBRARY_SHA256, got $actual"

mkdir -p "$DEST"
# Moved into place only once verified, so a failed run never leaves a
# half-written file that looks installed.
mv -f "$TMP/LICENSE" "$DEST/LICENSE"
chmod 0644 "$TMP/$LIBRARY"
mv -f "$TMP/$LIBRARY" "$DEST/$LIBRARY"

library_ok || die "$DEST/$LIBRARY does not verify after install"
echo "fetch-onnxruntime: installed $LIBRARY into $DEST"
