#!/usr/bin/env bash
# Fetches the nsfwjs 4.4.0 package (MIT) from the npm registry, checks it
# against pinned hashes and converts its MobileNetV2 weights into
# $MODERATO_MODELS_DIR/nsfwjs/mobilenet_v2.safetensors (default: ./models).
# Idempotent: does nothing when the converted file for this version is there.
# Needs npm and node (>= 18), sha256sum.
set -euo pipefail

VERSION="4.4.0"
SHA512_INTEGRITY="sha512-krC1fgeTLXtZwgdpKJ0jm7hqv0gTSRQQRL+FhOaxaJ9Wj92t42BO3csO2odwgTAgZgf2RvkwPtp0R8Aa7dc+MA=="
SHA256="585cd178f3b994337c4d10a87b080d342fc52f8b9bf0085c4d1f345a3a1c5382"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
models_dir="${MODERATO_MODELS_DIR:-$repo_root/models}"
dest="$models_dir/nsfwjs"
out="$dest/mobilenet_v2.safetensors"
stamp="$dest/VERSION"

if [[ -f "$out" && -f "$stamp" && "$(cat "$stamp")" == "nsfwjs@$VERSION $SHA256" ]]; then
  echo "nsfwjs $VERSION already converted: $out"
  exit 0
fi

for tool in npm node sha256sum tar; do
  command -v "$tool" >/dev/null || { echo "fetch-nsfwjs: '$tool' is required" >&2; exit 1; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "fetching nsfwjs@$VERSION from the npm registry"
(cd "$work" && npm pack --silent "nsfwjs@$VERSION" >/dev/null)
tarball="$work/nsfwjs-$VERSION.tgz"

actual_sha256="$(sha256sum "$tarball" | cut -d' ' -f1)"
if [[ "$actual_sha256" != "$SHA256" ]]; then
  echo "fetch-nsfwjs: sha256 mismatch for $tarball: got $actual_sha256, want $SHA256" >&2
  exit 1
fi
actual_integrity="sha512-$(node -e 'const c=require("crypto");process.stdout.write(c.createHash("sha512").update(require("fs").readFileSync(process.argv[1])).digest("base64"))' "$tarball")"
if [[ "$actual_integrity" != "$SHA512_INTEGRITY" ]]; then
  echo "fetch-nsfwjs: sha512 integrity mismatch: got $actual_integrity" >&2
  exit 1
fi

tar -xzf "$tarball" -C "$work" package/LICENSE package/dist/models/mobilenet_v2
mkdir -p "$dest"
node "$repo_root/scripts/convert-nsfwjs.mjs" "$work/package" "$out"
cp "$work/package/LICENSE" "$dest/LICENSE"
echo "nsfwjs@$VERSION $SHA256" > "$stamp"
echo "nsfwjs $VERSION ready in $dest"
