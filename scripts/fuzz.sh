#!/usr/bin/env bash
# Bounded fuzzing for CI: the request body's strict JSON check and the image
# decoding path, FUZZ_SECONDS each (default 50, so about two minutes with the
# build once it is cached). A crash fails the script; libFuzzer leaves the
# input in fuzz/artifacts/<target>/ (add it to tests/fixtures/images/fuzz/
# for images, so the unit test replays it).
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`). cargo-fuzz passes nightly
# compiler flags (-Zsanitizer=address and the like); the installed stable
# toolchain accepts them with RUSTC_BOOTSTRAP=1, so no nightly is needed.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-50}
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "scripts/fuzz.sh: cargo-fuzz is missing: cargo install cargo-fuzz" >&2
    exit 1
fi
export RUSTC_BOOTSTRAP=1
fuzz=(cargo fuzz)

for target in request_json image_decode; do
    echo "fuzzing $target for ${seconds}s"
    # -timeout: one input taking over 10 s is a hang; -rss_limit_mb: the
    # image path's limits must hold memory far below this.
    "${fuzz[@]}" run "$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=1024 -print_final_stats=1
done
