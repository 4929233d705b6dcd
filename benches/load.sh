#!/usr/bin/env bash
# Load benchmark of the whole pipeline (auth, rate limit, metering, signing,
# model) against the release binary on loopback, with wrk. Runs twice: with
# the configured text classifier and with the trivial `null` one, so that the
# service's own overhead around the model is visible. Not a test: it prints
# requests per second and latency percentiles.
#
#   benches/load.sh [duration_s=15] [connections=8]
set -euo pipefail
cd "$(dirname "$0")/.."
duration="${1:-15}"
connections="${2:-8}"
threads=$(( connections < 2 ? connections : 2 ))  # wrk needs connections >= threads
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install wrk" >&2; exit 1; }
scripts/setup.sh
cargo build --release --quiet --bin moderato
bin=target/release/moderato

work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
export MODERATO_DATABASE_URL="sqlite://$work/bench.db"
export MODERATO_AUTH__PEPPER_FILE="$work/pepper"
export MODERATO_SIGNING__KEY_FILE="$work/signing-key.pem"
export MODERATO_USAGE__JOURNAL_DIR="$work/usage-journal"
export MODERATO_LOG=warn
key=$("$bin" keys create --name bench --tier enterprise --rpm 100000000 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')

cat > "$work/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-API-Key"] = "$key"
wrk.body = '{"input":[{"type":"text","text":"Thanks for the quick reply, see you at the meeting tomorrow!"}]}'
LUA

run() {
  local classifier="$1" port="$2"
  MODERATO_ADDR="127.0.0.1:$port" MODERATO_TEXT_CLASSIFIER="$classifier" "$bin" serve &
  local pid=$!
  for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break; sleep 0.2; done
  # Warm up, then measure.
  wrk -t"$threads" -c"$connections" -d3s -s "$work/post.lua" "http://127.0.0.1:$port/v1/moderate" >/dev/null
  echo "== text classifier: $classifier ($connections connections, ${duration}s, one short text item)"
  wrk -t"$threads" -c"$connections" -d"${duration}s" --latency -s "$work/post.lua" "http://127.0.0.1:$port/v1/moderate" \
    | grep -E "Requests/sec|50%|75%|90%|99%|Non-2xx|requests in"
  kill -TERM "$pid"; wait "$pid" || true
}

run "${MODERATO_BENCH_CLASSIFIER:-minilm}" 18081
run null 18082
