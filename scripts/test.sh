#!/usr/bin/env bash
# The whole test suite: fetches the model files if missing, checks that
# PostgreSQL, Redis and Python's `cryptography` and `openai` are there, then
# runs every test (unit and integration, both storage backends).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

pg_url="${MODERATO_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
if ! (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
  echo "PostgreSQL is not reachable on 127.0.0.1:5432 (tests use $pg_url)." >&2
  echo "Start it, e.g.: pg_ctlcluster --skip-systemctl-redirect \$(ls /etc/postgresql) main start" >&2
  exit 1
fi
if ! (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
  echo "Redis is not reachable on 127.0.0.1:6379." >&2
  echo "Start it, e.g.: redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save \"\" --appendonly no" >&2
  exit 1
fi
if ! "${PYTHON:-python3}" -c 'import cryptography' 2>/dev/null; then
  echo "Python's cryptography package is missing (the signature tests verify with it): pip install cryptography" >&2
  exit 1
fi
if ! "${PYTHON:-python3}" -c 'import openai' 2>/dev/null; then
  echo "Python's openai package is missing (/v1/moderations is tested with the real SDK): pip install openai==3.54.0" >&2
  exit 1
fi

if ! "${PYTHON:-python3}" -c 'import aiosmtpd' 2>/dev/null; then
  echo "Python's aiosmtpd package is missing (the sign-up tests send e-mail through it): pip install aiosmtpd==1.4.6" >&2
  exit 1
fi

if [[ ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]]; then
  echo "DejaVu Sans is missing (the OCR tests render text with it): apt-get install -y fonts-dejavu-core" >&2
  exit 1
fi

chromedriver="${CHROMEDRIVER:-/usr/bin/chromedriver}"
if [[ ! -x "$chromedriver" || ! -x "${CHROME_BIN:-/usr/bin/chromium}" ]]; then
  echo "Chromium or chromedriver is missing (the browser tests drive the dashboard with them):" >&2
  echo "  apt-get install -y chromium chromium-driver   (or set CHROMEDRIVER and CHROME_BIN)" >&2
  exit 1
fi

cargo test --workspace --all-targets "$@"
