#!/usr/bin/env bash
# Property-based tests of the HTTP API against its own OpenAPI document:
# schemathesis reads /v1/openapi.json from the running service, generates
# valid and invalid requests for every operation, and checks each answer:
# no 5xx, a documented status, content type, schema and headers.
#
# Runs the debug binary the test step built (target/debug/moderato) on a free
# port over a temp SQLite database and data dir, with an enterprise key whose
# limit the run cannot reach, then stops it. Bounded: SCHEMATHESIS_EXAMPLES
# examples per operation and phase (default 50), SCHEMATHESIS_SECONDS of wall
# clock for the whole run (default 150).
set -euo pipefail
cd "$(dirname "$0")/.."

version=4.32.5
examples="${SCHEMATHESIS_EXAMPLES:-50}"
seconds="${SCHEMATHESIS_SECONDS:-150}"
python="${PYTHON:-python3}"
checks="${SCHEMATHESIS_CHECKS:-not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance}"
installed="$("$python" -c 'import importlib.metadata as m; print(m.version("schemathesis"))' 2>/dev/null || true)"
if [[ "$installed" != "$version" ]]; then
  "$python" -m pip install --quiet "schemathesis==$version"
fi

binary=target/debug/moderato
if [[ ! -x "$binary" ]]; then
  echo "$binary is missing: run scripts/test.sh (or cargo build) first" >&2
  exit 1
fi

work="$(mktemp -d)"
server=""
cleanup() {
  if [[ -n "$server" ]]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
export MODERATO_ADDR="127.0.0.1:$port"
export MODERATO_DATABASE_URL="sqlite://$work/moderato.db"
export MODERATO_SIGNING__KEY_FILE="$work/signing-key.pem"
export MODERATO_AUTH__PEPPER_FILE="$work/api-key-pepper"
export MODERATO_USAGE__JOURNAL_DIR="$work/usage-journal"
# No metrics listener: its fixed default port could be taken on a CI machine.
export MODERATO_METRICS_ADDR=""
export MODERATO_LOG="${MODERATO_LOG:-warn}"

key="$("$binary" keys create --name schemathesis --tier enterprise --rpm 1000000 --json \
  | "$python" -c 'import json, sys; print(json.load(sys.stdin)["key"])')"

"$binary" serve >"$work/server.log" 2>&1 &
server=$!
base="http://127.0.0.1:$port"
for _ in $(seq 1 600); do
  curl -fsS "$base/ready" >/dev/null 2>&1 && break
  if ! kill -0 "$server" 2>/dev/null; then
    cat "$work/server.log" >&2
    echo "the service stopped during start-up" >&2
    exit 1
  fi
  sleep 0.2
done

status=0
timeout --kill-after=10 "$seconds" "$python" scripts/schemathesis_cli.py run "$base/v1/openapi.json" \
  --url "$base" \
  --header "X-API-Key: $key" \
  --checks "$checks" \
  --max-examples "$examples" \
  --workers 2 \
  --seed "${SCHEMATHESIS_SEED:-20261123}" \
  --request-timeout 30 \
  --no-color \
  --report junit --report-dir "${SCHEMATHESIS_REPORT_DIR:-$work/report}" \
  || status=$?
if [[ $status -ne 0 ]]; then
  echo "--- server log (last 50 lines) ---" >&2
  tail -n 50 "$work/server.log" >&2
  [[ $status -eq 124 ]] && echo "schemathesis did not finish within $seconds s" >&2
fi
exit "$status"
