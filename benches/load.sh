#!/usr/bin/env bash
# Load benchmark of the whole pipeline (auth, rate limit, metering, signing,
# model) against the release binary on loopback, with wrk. Not a test: it
# prints requests per second, latency percentiles and characters per second.
#
# Three workloads:
#   short   one short text item a request, with the configured text
#           classifier and with the trivial `null` one, so that the
#           service's own overhead around the model is visible;
#   other   one short text item a request in another language (German,
#           Spanish, Russian, Arabic, Hindi, Chinese in turn, about as long
#           as short's English one): such a text always pays for both
#           encoders and the heads for other languages on the accurate
#           path (short's English text pays for both too: its first-stage
#           scores pass the second stage's gate);
#   mixed1  the texts of benches/texts/mixed.jsonl (people's writing of mixed
#           lengths, written for the project), one a request;
#   mixed8  the same texts, eight a request (items + the combined text);
#   ocr     one image item a request: the OCR bench's 1024x768 screenshot
#           with ten lines of 18 px text (examples/ocr_screenshot.rs), with
#           [ocr] enabled, so the figure is a whole request around a read;
#   image   the same screenshot with [ocr] off: the request without the read.
#
#   benches/load.sh [duration_s=15] [connections=8] [workloads="short mixed1 mixed8"]
# (other runs when named: benches/load.sh 15 8 "short other")
# (the ocr and image workloads run when named: benches/load.sh 15 1 "ocr image")
#
# For benches/capacity.sh: BENCH_DATABASE_URL replaces the SQLite file (and
# MODERATO_REDIS_URL, like any MODERATO_ variable, reaches the service);
# BENCH_SERVICE_CPUS and BENCH_CLIENT_CPUS pin the service and wrk to CPUs
# (taskset lists); BENCH_HOOK is run as `$BENCH_HOOK before LABEL` just
# before each measured run and `$BENCH_HOOK after WRK_OUTPUT` just after.
set -euo pipefail
cd "$(dirname "$0")/.."
duration="${1:-15}"
connections="${2:-8}"
workloads="${3:-short mixed1 mixed8}"
threads=$(( connections < 2 ? connections : 2 ))  # wrk needs connections >= threads
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install wrk" >&2; exit 1; }
scripts/setup.sh
# MODERATO_BENCH_BIN: another build's binary (heads of before a change, say).
# Unset once read: the service refuses MODERATO_ variables it does not know.
if [[ -n "${MODERATO_BENCH_BIN:-}" ]]; then
  bin="$MODERATO_BENCH_BIN"
  unset MODERATO_BENCH_BIN
else
  cargo build --release --quiet --bin moderato
  bin=target/release/moderato
fi

work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
export MODERATO_DATABASE_URL="${BENCH_DATABASE_URL:-sqlite://$work/bench.db}"
export MODERATO_AUTH__PEPPER_FILE="$work/pepper"
export MODERATO_SIGNING__KEY_FILE="$work/signing-key.pem"
export MODERATO_USAGE__JOURNAL_DIR="$work/usage-journal"
export MODERATO_LOG=warn
# Measure the model, not the embedding cache: wrk repeats the same requests.
export MODERATO_TEXT_MODEL__EMBEDDING_CACHE_ENTRIES="${MODERATO_TEXT_MODEL__EMBEDDING_CACHE_ENTRIES:-0}"
key=$("$bin" keys create --name bench --tier enterprise --rpm 100000000 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')

# A wrk script cycling through request bodies; prints the characters of
# text per request on its first line. Its argument is short, other, image, or
# the number of mixed texts a request.
bodies() {
  local kind="$1"
  python3 - "$kind" "$key" <<'PY'
import base64, json, os, sys
kind, key = sys.argv[1], sys.argv[2]
per = 1
if kind == "image":
    png = base64.b64encode(open(os.environ["BENCH_IMAGE"], "rb").read()).decode()
    texts = []
    reqs = [[{"type": "image", "base64": "data:image/png;base64," + png}]]
elif kind == "short":
    texts = ["Thanks for the quick reply, see you at the meeting tomorrow!"]
elif kind == "other":
    texts = [
        "Danke für die schnelle Antwort, wir sehen uns morgen beim Treffen!",
        "Gracias por la rápida respuesta, ¡nos vemos mañana en la reunión!",
        "Спасибо за быстрый ответ, увидимся завтра на встрече!",
        "شكرا على الرد السريع، أراك غدا في الاجتماع!",
        "जल्दी जवाब देने के लिए धन्यवाद, कल मीटिंग में मिलते हैं!",
        "谢谢你这么快回复，我们明天开会时见！",
    ]
else:
    per = int(kind)
    texts = [json.loads(l)["text"] for l in open("benches/texts/mixed.jsonl", encoding="utf-8")]
    texts = texts[: len(texts) // per * per]
if texts:
    reqs = [[{"type": "text", "text": t} for t in texts[i:i + per]] for i in range(0, len(texts), per)]
chars = sum(len(t) for t in texts) / len(reqs)
print(f"-- {chars:.1f}")
bodies = [json.dumps({"input": r}) for r in reqs]
print('wrk.method = "POST"')
print('wrk.headers["Content-Type"] = "application/json"')
print(f'wrk.headers["X-API-Key"] = "{key}"')
print("local bodies = {" + ",".join("[==[" + b + "]==]" for b in bodies) + "}")
print("local i = 0")
print("request = function() i = i % #bodies + 1; return wrk.format(nil, nil, nil, bodies[i]) end")
PY
}

service_pin=(); client_pin=()
[[ -n "${BENCH_SERVICE_CPUS:-}" ]] && service_pin=(taskset -c "$BENCH_SERVICE_CPUS")
[[ -n "${BENCH_CLIENT_CPUS:-}" ]] && client_pin=(taskset -c "$BENCH_CLIENT_CPUS")
hook() { if [[ -n "${BENCH_HOOK:-}" ]]; then "$BENCH_HOOK" "$@"; fi; }

run() {
  local classifier="$1" port="$2" kind="$3" label="$4" ocr="${5:-false}"
  bodies "$kind" > "$work/post.lua"
  local chars
  chars=$(head -1 "$work/post.lua" | cut -d' ' -f2)
  MODERATO_ADDR="127.0.0.1:$port" MODERATO_TEXT_CLASSIFIER="$classifier" \
    MODERATO_OCR__ENABLED="$ocr" "${service_pin[@]}" "$bin" serve &
  local pid=$!
  for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break; sleep 0.2; done
  # Warm up, then measure.
  "${client_pin[@]}" wrk -t"$threads" -c"$connections" -d3s --timeout 60s -s "$work/post.lua" "http://127.0.0.1:$port/v1/moderate" >/dev/null
  echo "== text classifier: $classifier ($connections connections, ${duration}s, $label)"
  hook before "$classifier: $label"
  "${client_pin[@]}" wrk -t"$threads" -c"$connections" -d"${duration}s" --timeout 60s --latency -s "$work/post.lua" "http://127.0.0.1:$port/v1/moderate" \
    > "$work/out.txt"
  hook after "$work/out.txt"
  grep -E "Requests/sec|50%|75%|90%|99%|Non-2xx|Socket errors|requests in" "$work/out.txt"
  awk -v c="$chars" '/Requests\/sec/ { printf "  Characters/sec: %.0f (%.0f characters a request)\n", $2 * c, c }' "$work/out.txt"
  kill -TERM "$pid"; wait "$pid" || true
}

classifier="${MODERATO_BENCH_CLASSIFIER:-minilm}"
for w in $workloads; do
  case "$w" in
    short) run "$classifier" 18081 short "one short text item a request"
           run null 18082 short "one short text item a request" ;;
    other) run "$classifier" 18087 other "one short text item a request, in another language" ;;
    mixed1) run "$classifier" 18083 1 "mixed-length texts, one a request" ;;
    mixed8) run "$classifier" 18084 8 "mixed-length texts, eight a request" ;;
    ocr|image) export BENCH_IMAGE="$work/screenshot.png"
         cargo run --quiet --example ocr_screenshot -- "$BENCH_IMAGE"
         if [[ "$w" == ocr ]]; then
           run "$classifier" 18085 image "one 1024x768 screenshot with ten lines of text a request, OCR on" true
         else
           run "$classifier" 18086 image "one 1024x768 screenshot with ten lines of text a request, OCR off" false
         fi ;;
    *) echo "unknown workload $w (short, other, mixed1, mixed8, ocr, image)" >&2; exit 1 ;;
  esac
done
