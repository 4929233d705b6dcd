#!/usr/bin/env bash
# Usage storage at scale (issue #57): loads raw usage events into a
# PostgreSQL database of its own and times what reads them.
#
#   benches/usage_scale.sh setup new|old     # database + schema + 500 accounts, 1,000 keys
#   benches/usage_scale.sh fill  new|old FIRST_DAY DAYS PER_DAY
#   benches/usage_scale.sh queries new|old MONTH_FIRST_DAY TODAY
#   benches/usage_scale.sh disk new|old
#   benches/usage_scale.sh drop new|old
#
# `new` is this branch's schema (migrations 0001-0008: day partitions and
# hourly rollups), `old` today's main (0001-0007: one table, billing from
# the raw rows). The insert rate through the service's own write path is
# measured by `cargo bench --bench usage_insert` (see docs/operations.md);
# `fill` is a set-based generator that writes the same rows and, for
# `new`, adds them to the rollups with the statement the write path uses
# (a CTE over the INSERT's RETURNING), a day per statement.
#
# Environment: PGHOST (127.0.0.1), PGUSER (postgres), BENCH_DB
# (moderato_usage_bench), RUNS (11 timings per query). Run it niced on a
# shared machine: `nice -n 5 benches/usage_scale.sh ...`.
set -euo pipefail
export PGHOST=${PGHOST:-127.0.0.1} PGUSER=${PGUSER:-postgres}
cd "$(dirname "$0")/.."

kind=${2:?new or old}
case "$kind" in
new) migrations=(migrations/postgres/000[1-8]_*.sql) ;;
old) migrations=(migrations/postgres/000[1-7]_*.sql) ;;
*) echo "new or old, not $kind" >&2; exit 2 ;;
esac
db=${BENCH_DB:-moderato_usage_bench}_$kind
runs=${RUNS:-11}
q() { psql -X -q -v ON_ERROR_STOP=1 -d "$db" "$@"; }
# The server process does the work, not psql: it gets the same `nice` as
# this script (when we may renice it, e.g. as root or as postgres).
renice_backend="SELECT pg_backend_pid() AS backend \\gset
\\setenv BENCH_BACKEND :backend
\\! renice -n $(nice) -p \"\$BENCH_BACKEND\" >/dev/null 2>&1 || true"

setup() {
    psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
    for f in "${migrations[@]}"; do q -1 -f "$f"; done
    # 500 customer accounts with 2 keys each; the odd key of each account
    # names a policy of the account (its events carry it).
    q <<'SQL'
INSERT INTO accounts (id, email, role, tier, created_at)
SELECT md5('account' || a)::uuid::text, 'user' || a || '@example.com', 'customer', 'pro', now()
FROM generate_series(1, 500) a;
INSERT INTO api_keys (id, name, tier, secret_hash, created_at, account_id)
SELECT substr(md5('key' || k), 1, 16), 'key ' || k, 'pro', '\x00', now(),
       md5('account' || ((k + 1) / 2))::uuid::text
FROM generate_series(1, 1000) k;
CREATE TABLE bench_keys AS
SELECT k AS n, substr(md5('key' || k), 1, 16) AS key_id,
       CASE WHEN k % 2 = 1 THEN md5('policy' || k)::uuid::text END AS policy_id
FROM generate_series(1, 1000) k;
SQL
}

# One day of events at PER_DAY events, spread evenly over the day, keys
# round-robin. Mix: 2% rate-limited (429), 1% errors (400), the rest
# billable; 1-4 text items, 10% with an image, 5% deep analyses, 8% flagged.
# Request ids are shaped like the service's (`modr_` and a time-ordered
# UUIDv7 in hex).
COLUMNS="request_id, key_id, at, status, text_items, text_chars, image_items, image_bytes,
         deep_analyses, flagged, rate_limited, billable, latency_ms, endpoint, policy_id"
generator_sql() {
    local day=$1 per_day=$2
    cat <<SQL
SELECT 'modr_' || lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0')
           || substr(md5(g::text || '$day'), 1, 20),
       b.key_id, t,
       CASE WHEN g % 50 = 0 THEN 429 WHEN g % 100 = 1 THEN 400 ELSE 200 END,
       1 + g % 4, 60 + (g * 37) % 1900, (g % 10 = 0)::int, CASE WHEN g % 10 = 0 THEN 120000 ELSE 0 END,
       (g % 20 = 0)::int, g % 12 = 0, g % 50 = 0, g % 50 <> 0 AND g % 100 <> 1,
       5 + g % 45, CASE WHEN g % 10 < 7 THEN 'moderate' ELSE 'moderations' END, b.policy_id
FROM generate_series(0::bigint, $per_day - 1) g
CROSS JOIN LATERAL (SELECT '$day'::timestamptz + g * (86400.0 / $per_day) * interval '1 second' AS t) tt
JOIN bench_keys b ON b.n = 1 + (g * 7919) % 1000
SQL
}

# A day written in bulk: `new` fills a table of its own, builds the
# partition's indexes once (faster than row by row, and a little more
# compact), attaches it (which checks the keys and the range), and adds
# the day to the rollups with the write path's aggregation; `old` inserts
# into the one table with its indexes in place, as main would hold them.
fill_day_sql() {
    local day=$1 per_day=$2
    if [ "$kind" = old ]; then
        echo "$renice_backend"
        echo "INSERT INTO usage_events ($COLUMNS) $(generator_sql "$day" "$per_day") ON CONFLICT DO NOTHING;"
        return
    fi
    local name="usage_events_p${day//-/}"
    cat <<SQL
$renice_backend
SET maintenance_work_mem = '512MB';
BEGIN;
CREATE TABLE $name (LIKE usage_events INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
INSERT INTO $name ($COLUMNS) $(generator_sql "$day" "$per_day");
ALTER TABLE $name ADD PRIMARY KEY (request_id, at);
CREATE INDEX ON $name (key_id, at);
CREATE INDEX ON $name (at);
ALTER TABLE usage_events ATTACH PARTITION $name
    FOR VALUES FROM ('$day 00:00:00+00') TO ('$(date -u -d "$day + 1 day" +%F) 00:00:00+00');
INSERT INTO usage_hourly AS h (key_id, account_id, hour, policy_id, events, requests,
    text_items, text_chars, image_items, image_bytes, deep_analyses, rate_limited, flagged, last_at)
SELECT s.key_id, k.account_id, date_trunc('hour', s.at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
    COALESCE(s.policy_id, ''), COUNT(*), COUNT(*) FILTER (WHERE s.billable),
    COALESCE(SUM(s.text_items) FILTER (WHERE s.billable), 0),
    COALESCE(SUM(s.text_chars) FILTER (WHERE s.billable), 0),
    COALESCE(SUM(s.image_items) FILTER (WHERE s.billable), 0),
    COALESCE(SUM(s.image_bytes) FILTER (WHERE s.billable), 0),
    COALESCE(SUM(s.deep_analyses) FILTER (WHERE s.billable), 0),
    COUNT(*) FILTER (WHERE s.rate_limited), COUNT(*) FILTER (WHERE s.flagged), MAX(s.at)
FROM $name s JOIN api_keys k ON k.id = s.key_id
GROUP BY 1, 2, 3, 4 ORDER BY 1, 3, 4
ON CONFLICT (key_id, hour, policy_id) DO UPDATE SET
    events = h.events + excluded.events, requests = h.requests + excluded.requests,
    text_items = h.text_items + excluded.text_items, text_chars = h.text_chars + excluded.text_chars,
    image_items = h.image_items + excluded.image_items, image_bytes = h.image_bytes + excluded.image_bytes,
    deep_analyses = h.deep_analyses + excluded.deep_analyses,
    rate_limited = h.rate_limited + excluded.rate_limited, flagged = h.flagged + excluded.flagged,
    last_at = GREATEST(h.last_at, excluded.last_at);
COMMIT;
SQL
}

fill() {
    local first=${3:?first day} days=${4:?days} per_day=${5:?events per day}
    for ((i = 0; i < days; i++)); do
        local day t0 t1
        day=$(date -u -d "$first + $i day" +%F)
        t0=$(date +%s.%N)
        fill_day_sql "$day" "$per_day" | q
        t1=$(date +%s.%N)
        printf '%s %s events %.1f s %.0f events/s\n' "$day" "$per_day" \
            "$(echo "$t1 - $t0" | bc)" "$(echo "$per_day / ($t1 - $t0)" | bc)"
    done
    q -c "VACUUM ANALYZE"
}

# p50, min and max of RUNS timings of one statement (psql's \timing, so
# client-side: what a billing job sees), after one warm-up run.
time_query() {
    local label=$1 sql=$2
    local times
    times=$( { echo '\timing on'; for ((r = 0; r <= runs; r++)); do echo "$sql"; done; } \
        | q -o /dev/null | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -n +2 | sort -n)
    local n p50
    n=$(echo "$times" | wc -l)
    p50=$(echo "$times" | sed -n "$(((n + 1) / 2))p")
    printf '%-34s p50 %9.1f ms  min %9.1f  max %9.1f  (%d runs)\n' "$label" "$p50" \
        "$(echo "$times" | head -1)" "$(echo "$times" | tail -1)" "$n"
}

queries() {
    local month=${3:?first day of the month} today=${4:?today}
    local next since account
    next=$(date -u -d "$month + 1 month" +%F)
    since=$(date -u -d "$today - 29 day" +%F)
    account=$(q -At -c "SELECT md5('account1')::uuid::text")
    local k1 k2
    k1=$(q -At -c "SELECT substr(md5('key1'), 1, 16)")
    k2=$(q -At -c "SELECT substr(md5('key2'), 1, 16)")
    if [ "$kind" = new ]; then
        # What `Store::billing` runs (month, one key or all keys since a day),
        # bounded to the month as a bill is.
        local bill="SELECT key_id, date_trunc('month', hour AT TIME ZONE 'UTC')::date AS period_start,
            SUM(requests)::BIGINT, SUM(text_items)::BIGINT, SUM(text_chars)::BIGINT,
            SUM(image_items)::BIGINT, SUM(deep_analyses)::BIGINT, SUM(rate_limited)::BIGINT
            FROM usage_hourly WHERE hour >= '$month' AND hour < '$next'"
        local group="GROUP BY key_id, period_start HAVING SUM(requests) > 0 OR SUM(rate_limited) > 0 ORDER BY 1, 2"
        time_query "month bill, one account (2 keys)" "$bill AND account_id = '$account' $group;"
        time_query "month bill, all accounts" "$bill $group;"
        time_query "view usage_billing_daily, month" "
            SELECT key_id, sum(requests), sum(text_items), sum(image_items), sum(deep_analyses)
            FROM usage_billing_daily WHERE day >= '$month' AND day < '$next' GROUP BY 1 ORDER BY 1;"
        time_query "usage page (2 keys, 30 days)" "
            SELECT key_id, (hour AT TIME ZONE 'UTC')::date AS d, SUM(requests)::BIGINT,
                SUM(text_items)::BIGINT, SUM(image_items)::BIGINT, SUM(rate_limited)::BIGINT
            FROM usage_hourly WHERE key_id IN ('$k1', '$k2') AND hour >= '$since'
            GROUP BY key_id, d HAVING SUM(requests) > 0 OR SUM(rate_limited) > 0 ORDER BY 1, 2;"
        time_query "usage CSV (2 keys, 30 days)" "
            SELECT key_id, (hour AT TIME ZONE 'UTC')::date AS d, NULLIF(policy_id, ''),
                SUM(requests)::BIGINT, SUM(text_items + image_items)::BIGINT, SUM(rate_limited)::BIGINT
            FROM usage_hourly WHERE key_id IN ('$k1', '$k2') AND hour >= '$since'
            GROUP BY key_id, d, usage_hourly.policy_id
            HAVING SUM(requests) > 0 OR SUM(rate_limited) > 0 ORDER BY 1, 2, usage_hourly.policy_id;"
        time_query "keys page: last used (2 keys)" "
            SELECT k.id, (SELECT last_at FROM usage_hourly h WHERE h.key_id = k.id
                ORDER BY hour DESC, last_at DESC LIMIT 1) FROM api_keys k WHERE k.account_id = '$account';"
    else
        # main's `Store::billing`, `policy_usage` and `account_keys`.
        local bill="SELECT key_id, date_trunc('month', at AT TIME ZONE 'UTC')::date AS period_start,
            COUNT(*) FILTER (WHERE billable), COALESCE(SUM(text_items) FILTER (WHERE billable), 0)::BIGINT,
            COALESCE(SUM(text_chars) FILTER (WHERE billable), 0)::BIGINT,
            COALESCE(SUM(image_items) FILTER (WHERE billable), 0)::BIGINT,
            COALESCE(SUM(deep_analyses) FILTER (WHERE billable), 0)::BIGINT,
            COUNT(*) FILTER (WHERE rate_limited)
            FROM usage_events WHERE (billable OR rate_limited) AND at >= '$month' AND at < '$next'"
        time_query "month bill, one account (2 keys)" \
            "$bill AND key_id IN (SELECT id FROM api_keys WHERE account_id = '$account') GROUP BY 1, 2 ORDER BY 1, 2;"
        runs=${OLD_ALL_RUNS:-3} time_query "month bill, all accounts" "$bill GROUP BY 1, 2 ORDER BY 1, 2;"
        runs=${OLD_ALL_RUNS:-3} time_query "view usage_billing_daily, month" "
            SELECT key_id, sum(requests), sum(text_items), sum(image_items), sum(deep_analyses)
            FROM usage_billing_daily WHERE day >= '$month' AND day < '$next' GROUP BY 1 ORDER BY 1;"
        time_query "usage page (2 keys, 30 days)" "
            SELECT key_id, (at AT TIME ZONE 'UTC')::date AS d, COUNT(*) FILTER (WHERE billable),
                COALESCE(SUM(text_items) FILTER (WHERE billable), 0)::BIGINT,
                COALESCE(SUM(image_items) FILTER (WHERE billable), 0)::BIGINT,
                COUNT(*) FILTER (WHERE rate_limited)
            FROM usage_events WHERE (billable OR rate_limited) AND key_id IN ('$k1', '$k2') AND at >= '$since'
            GROUP BY key_id, d ORDER BY 1, 2;"
        time_query "usage CSV (2 keys, 30 days)" "
            SELECT key_id, (at AT TIME ZONE 'UTC')::date AS d, policy_id, COUNT(*) FILTER (WHERE billable),
                COALESCE(SUM(text_items + image_items) FILTER (WHERE billable), 0)::BIGINT,
                COUNT(*) FILTER (WHERE rate_limited)
            FROM usage_events WHERE (billable OR rate_limited) AND key_id IN ('$k1', '$k2') AND at >= '$since'
            GROUP BY key_id, d, policy_id ORDER BY 1, 2, 3 NULLS FIRST;"
        time_query "keys page: last used (2 keys)" "
            SELECT k.id, (SELECT MAX(u.at) FROM usage_events u WHERE u.key_id = k.id)
            FROM api_keys k WHERE k.account_id = '$account';"
    fi
}

disk() {
    q -c "
        SELECT CASE WHEN c.relname ~ '^usage_events' THEN 'usage_events (all partitions)'
                    ELSE c.relname END AS relation,
               pg_size_pretty(SUM(pg_table_size(c.oid))) AS table,
               pg_size_pretty(SUM(pg_indexes_size(c.oid))) AS indexes,
               SUM(pg_total_relation_size(c.oid)) AS bytes
        FROM pg_class c
        WHERE c.relkind = 'r' AND c.relname ~ '^usage_(events|hourly)'
        GROUP BY 1 ORDER BY 1;"
    q -At -c "
        SELECT 'events: ' || (SELECT COUNT(*) FROM usage_events) || ', bytes per million events (events + indexes + rollups): ' ||
               pg_size_pretty((SELECT SUM(pg_total_relation_size(c.oid)) FROM pg_class c
                               WHERE c.relkind = 'r' AND c.relname ~ '^usage_(events|hourly)')
                              * 1000000 / GREATEST((SELECT COUNT(*) FROM usage_events), 1))"
}

case "${1:?setup, fill, queries, disk or drop}" in
setup) setup ;;
fill) fill "$@" ;;
queries) queries "$@" ;;
disk) disk ;;
drop) psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $db" ;;
*) echo "unknown command $1" >&2; exit 2 ;;
esac
