#!/usr/bin/env bash
# Does one heavy request starve short ones? Runs the binary (default: the
# release build), keeps N heavy requests (3 items of 30,000 characters, with
# their combined texts) in flight from one key, and measures a short text's
# latency with wrk on one connection, before and during the heavy load. Not a
# test: it prints wrk's latency percentiles.
#
#   benches/heavy_vs_short.sh [binary=target/release/moderato] [heavy=4] [seconds=15]
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/moderato}"
heavy="${2:-4}"
duration="${3:-15}"
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install wrk" >&2; exit 1; }

work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
export MODERATO_DATABASE_URL="sqlite://$work/bench.db"
export MODERATO_AUTH__PEPPER_FILE="$work/pepper"
export MODERATO_SIGNING__KEY_FILE="$work/signing-key.pem"
export MODERATO_USAGE__JOURNAL_DIR="$work/usage-journal"
export MODERATO_BUDGET__CHARS_PER_MINUTE__ENTERPRISE=1000000000
export MODERATO_LOG=error
key=$("$bin" keys create --name bench --tier enterprise --rpm 100000000 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')
port=18090
MODERATO_ADDR="127.0.0.1:$port" "$bin" serve &
for _ in $(seq 1 300); do curl -fs "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break; sleep 0.2; done

cat > "$work/short.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-API-Key"] = "$key"
wrk.body = '{"input":[{"type":"text","text":"Thanks for the quick reply, see you at the meeting tomorrow!"}]}'
LUA
python3 - "$work/heavy.json" <<'PY'
import json, random, sys
random.seed(1)
words = "the a meeting report garden river quick blue window table answer yesterday".split()
def text(n):
    out = []
    while sum(len(w) + 1 for w in out) < n:
        out.append(random.choice(words))
    return " ".join(out)[:n]
json.dump({"input": [{"type": "text", "text": text(30000)} for _ in range(3)]}, open(sys.argv[1], "w"))
PY

measure() {
  wrk -t1 -c1 -d"${duration}s" --latency -s "$work/short.lua" "http://127.0.0.1:$port/v1/moderate" \
    | grep -E "Requests/sec|50%|90%|99%|Non-2xx"
}
wrk -t1 -c1 -d3s -s "$work/short.lua" "http://127.0.0.1:$port/v1/moderate" >/dev/null
echo "== short text alone"
measure
for _ in $(seq 1 "$heavy"); do
  ( while true; do
      curl -s -o /dev/null -w '%{http_code} %{time_total}\n' -H "X-API-Key: $key" -H 'Content-Type: application/json' \
        --data-binary @"$work/heavy.json" "http://127.0.0.1:$port/v1/moderate" >> "$work/heavy.log"
    done ) &
done
sleep 2
echo "== short text while $heavy heavy requests (90,000 characters each) are in flight"
measure
echo "== heavy requests: status and seconds"
sort "$work/heavy.log" | awk '{n[$1]++; t[$1]+=$2} END {for (s in n) printf "%s: %d, mean %.1f s\n", s, n[s], t[s]/n[s]}'
