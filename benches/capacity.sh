#!/usr/bin/env bash
# The capacity model's inputs (docs/operations.md): requests/s of one core
# for each workload, and what each 1,000 requests cost PostgreSQL and Redis.
#
# Runs benches/load.sh with the service pinned to CPU 0 and wrk to CPU 1,
# against a private PostgreSQL (pg_stat_statements loaded: statements are
# counted exactly, whatever else runs on the machine's own server) and a
# private Redis (INFO commandstats), both on loopback in a temp dir. Around
# each measured run it resets the counters, then prints per 1,000 requests:
# PostgreSQL statements and transactions, WAL bytes and the usage table's
# growth; Redis commands and bytes in and out. Not a test.
#
#   benches/capacity.sh [duration_s=20] [connections=8] [workloads="short mixed1 mixed8"]
# Needs PostgreSQL's server binaries (postgresql-15), redis-server, wrk;
# run as root (the private cluster runs as the postgres user).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == before || "${1:-}" == after ]]; then
  # Called by load.sh (BENCH_HOOK) with CAPACITY_* set by the run below.
  pg() { psql -h 127.0.0.1 -p "$CAPACITY_PG_PORT" -U postgres -d moderato -tAqc "$1"; }
  rc() { redis-cli -p "$CAPACITY_REDIS_PORT" "$@"; }
  state="$CAPACITY_DIR/state"
  if [[ "$1" == before ]]; then
    pg "SELECT pg_stat_statements_reset()" >/dev/null
    rc CONFIG RESETSTAT >/dev/null
    {
      pg "SELECT pg_current_wal_lsn()"
      pg "SELECT pg_total_relation_size('usage_events')"
      pg "SELECT count(*) FROM usage_events"
      pg "SELECT xact_commit FROM pg_stat_database WHERE datname = 'moderato'"
    } > "$state"
    exit 0
  fi
  # Let the last batches land (flush interval 100 ms).
  sleep 1
  mapfile -t before < "$state"
  rows=$(( $(pg "SELECT count(*) FROM usage_events") - before[2] ))
  (( rows > 0 )) || { echo "  no usage rows were written"; exit 0; }
  wal=$(pg "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '${before[0]}')")
  table=$(( $(pg "SELECT pg_total_relation_size('usage_events')") - before[1] ))
  xacts=$(( $(pg "SELECT xact_commit FROM pg_stat_database WHERE datname = 'moderato'") - before[3] ))
  # The statements the service ran (not these counters' own queries).
  statements=$(pg "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
                   WHERE query NOT LIKE '%pg_stat%' AND query NOT LIKE '%pg_current_wal_lsn%' AND query NOT LIKE '%pg_total_relation_size%' AND query NOT LIKE 'SELECT count(*) FROM usage_events%'")
  redis_calls=$(rc INFO commandstats | awk -F'[=,:]' '/^cmdstat_/ && $1 != "cmdstat_info" && $1 != "cmdstat_config" { n += $3 } END { print n + 0 }')
  redis_in=$(rc INFO stats | awk -F: '/^total_net_input_bytes/ { print $2 + 0 }')
  redis_out=$(rc INFO stats | awk -F: '/^total_net_output_bytes/ { print $2 + 0 }')
  awk -v rows="$rows" -v st="$statements" -v x="$xacts" -v wal="$wal" -v table="$table" \
      -v rcalls="$redis_calls" -v rin="$redis_in" -v rout="$redis_out" 'BEGIN {
    k = 1000 / rows
    printf "  per 1,000 requests (%d usage rows): PostgreSQL %.0f statements, %.0f transactions, %.0f kB WAL, usage table +%.0f kB (%.0f bytes a row); Redis %.0f commands, %.0f kB in, %.0f kB out\n",
      rows, st * k, x * k, wal * k / 1000, table * k / 1000, table / rows, rcalls * k, rin * k / 1000, rout * k / 1000
  }'
  pg "SELECT calls, left(regexp_replace(query, '\s+', ' ', 'g'), 90) FROM pg_stat_statements
      WHERE query NOT LIKE '%pg_stat%' AND query NOT LIKE '%pg_current_wal_lsn%' AND query NOT LIKE '%pg_total_relation_size%' AND query NOT LIKE 'SELECT count(*) FROM usage_events%'
      ORDER BY calls DESC LIMIT 4" | sed 's/^/    /'
  rc INFO commandstats | grep -v "cmdstat_info\|cmdstat_config\|^#" | sed 's/^/    /' | head -4
  exit 0
fi

duration="${1:-20}"
connections="${2:-8}"
workloads="${3:-short mixed1 mixed8}"
pgbin="/usr/lib/postgresql/$(ls /usr/lib/postgresql | sort -V | tail -n1)/bin"
[[ -x "$pgbin/initdb" ]] || { echo "PostgreSQL's server binaries are needed" >&2; exit 1; }

work=$(mktemp -d)
chmod 755 "$work"
export CAPACITY_DIR="$work" CAPACITY_PG_PORT=15499 CAPACITY_REDIS_PORT=16399
cleanup() {
  su postgres -s /bin/sh -c "$pgbin/pg_ctl -D $work/pg -m fast stop" >/dev/null 2>&1 || true
  redis-cli -p "$CAPACITY_REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
install -d -o postgres "$work/pg" "$work/sock"
su postgres -s /bin/sh -c "$pgbin/initdb -D $work/pg -U postgres -A trust >/dev/null"
su postgres -s /bin/sh -c "$pgbin/pg_ctl -D $work/pg -l $work/sock/pg.log -w start -o \"-p $CAPACITY_PG_PORT -k $work/sock -c listen_addresses=127.0.0.1 -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all\"" >/dev/null
psql -h 127.0.0.1 -p "$CAPACITY_PG_PORT" -U postgres -qc "CREATE DATABASE moderato"
psql -h 127.0.0.1 -p "$CAPACITY_PG_PORT" -U postgres -d moderato -qc "CREATE EXTENSION pg_stat_statements"
redis-server --port "$CAPACITY_REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes >/dev/null

echo "capacity: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); flags: $(grep -m1 -o 'avx512_vnni\|avx_vnni\|amx_int8' /proc/cpuinfo | sort -u | xargs)"
BENCH_DATABASE_URL="postgres://postgres@127.0.0.1:$CAPACITY_PG_PORT/moderato" \
  MODERATO_REDIS_URL="redis://127.0.0.1:$CAPACITY_REDIS_PORT" \
  BENCH_SERVICE_CPUS=0 BENCH_CLIENT_CPUS=1 BENCH_HOOK="$PWD/benches/capacity.sh" \
  benches/load.sh "$duration" "$connections" "$workloads"
