#!/usr/bin/env bash
# Runs the service on its embedded defaults: SQLite under ./data, in-process
# rate limits, the built-in models (fetched first if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec cargo run --release --bin moderato -- serve "$@"
