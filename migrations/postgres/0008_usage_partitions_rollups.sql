-- Usage at scale (issue #57): raw events partitioned by UTC day, so that
-- retention drops whole days (no DELETE, no vacuum debt) and a day's writes
-- touch only that day's indexes; and hourly rollups per key and policy,
-- kept in step with the events by the batch insert itself, which billing,
-- the usage page and its CSV read instead of the raw rows.
--
-- Existing rows are copied into the partitioned table (one partition per
-- day they cover) inside this migration's transaction: nothing is lost, and
-- a large table makes this migration take as long as copying it.

DROP VIEW usage_billing_daily;
ALTER TABLE usage_events RENAME TO usage_events_legacy;
ALTER TABLE usage_events_legacy RENAME CONSTRAINT usage_events_pkey TO usage_events_legacy_pkey;
ALTER INDEX usage_events_key_at RENAME TO usage_events_legacy_key_at;
ALTER INDEX usage_events_at RENAME TO usage_events_legacy_at;

-- A partitioned table's unique keys must hold the partition key: a retried
-- batch repeats each event's request_id *and* time (both come from the
-- journal), so (request_id, at) still makes retries idempotent.
CREATE TABLE usage_events (
    request_id    TEXT        NOT NULL,
    key_id        TEXT        NOT NULL REFERENCES api_keys (id),
    at            TIMESTAMPTZ NOT NULL,
    status        INTEGER     NOT NULL CHECK (status BETWEEN 0 AND 65535),
    text_items    BIGINT      NOT NULL CHECK (text_items >= 0),
    text_chars    BIGINT      NOT NULL CHECK (text_chars >= 0),
    image_items   BIGINT      NOT NULL CHECK (image_items >= 0),
    image_bytes   BIGINT      NOT NULL CHECK (image_bytes >= 0),
    deep_analyses BIGINT      NOT NULL CHECK (deep_analyses >= 0),
    flagged       BOOLEAN     NOT NULL,
    rate_limited  BOOLEAN     NOT NULL,
    billable      BOOLEAN     NOT NULL,
    latency_ms    BIGINT      NOT NULL CHECK (latency_ms >= 0),
    endpoint      TEXT        NOT NULL DEFAULT 'moderate'
                              CHECK (endpoint IN ('moderate', 'moderations')),
    policy_id     TEXT        NULL,
    PRIMARY KEY (request_id, at)
) PARTITION BY RANGE (at);
CREATE INDEX usage_events_key_at ON usage_events (key_id, at);
CREATE INDEX usage_events_at ON usage_events (at);

-- Rows of a day without its partition (a clock far off, a journal replayed
-- from long ago, a service that has not made today's yet) land here rather
-- than being refused. Making that day's partition moves them out of it.
CREATE TABLE usage_events_default PARTITION OF usage_events DEFAULT;

-- Makes the partition of one UTC day, `usage_events_pYYYYMMDD`, unless it
-- exists, moving that day's rows out of the default partition (attaching
-- fails while the default holds rows of the range). Several replicas may
-- call it at once: an advisory lock makes them take turns.
CREATE FUNCTION moderato_usage_partition(day date) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    name text := 'usage_events_p' || to_char(day, 'YYYYMMDD');
    lo timestamptz := day::timestamp AT TIME ZONE 'UTC';
    hi timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
    IF to_regclass(name) IS NOT NULL THEN
        RETURN false;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('moderato_usage_partition'));
    IF to_regclass(name) IS NOT NULL THEN
        RETURN false;
    END IF;
    -- No row of the day may land in the default between moving them out
    -- and attaching (attaching would then fail); other days' inserts go on.
    LOCK TABLE usage_events_default IN EXCLUSIVE MODE;
    EXECUTE format('CREATE TABLE %I (LIKE usage_events INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
    EXECUTE format('WITH moved AS (DELETE FROM usage_events_default WHERE at >= $1 AND at < $2 RETURNING *) '
                   'INSERT INTO %I SELECT * FROM moved', name) USING lo, hi;
    EXECUTE format('ALTER TABLE usage_events ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   name, lo, hi);
    RETURN true;
END
$$;

SELECT moderato_usage_partition(day)
FROM (SELECT DISTINCT (at AT TIME ZONE 'UTC')::date AS day FROM usage_events_legacy) days;

INSERT INTO usage_events
    (request_id, key_id, at, status, text_items, text_chars, image_items, image_bytes,
     deep_analyses, flagged, rate_limited, billable, latency_ms, endpoint, policy_id)
SELECT request_id, key_id, at, status, text_items, text_chars, image_items, image_bytes,
       deep_analyses, flagged, rate_limited, billable, latency_ms, endpoint, policy_id
FROM usage_events_legacy;

-- Usage per key, UTC hour and policy. `requests` and the item counts are
-- of billable requests only (what a bill counts); `events` counts every
-- metered request, `last_at` is the latest of them (a key's "last used").
-- No reference to api_keys: a rollup must never refuse what its events
-- were allowed. `policy_id` is '' for "no policy" (a key column cannot be
-- NULL and stay unique).
CREATE TABLE usage_hourly (
    key_id        TEXT        NOT NULL,
    account_id    TEXT        NOT NULL,
    hour          TIMESTAMPTZ NOT NULL,
    policy_id     TEXT        NOT NULL DEFAULT '',
    events        BIGINT      NOT NULL,
    requests      BIGINT      NOT NULL,
    text_items    BIGINT      NOT NULL,
    text_chars    BIGINT      NOT NULL,
    image_items   BIGINT      NOT NULL,
    image_bytes   BIGINT      NOT NULL,
    deep_analyses BIGINT      NOT NULL,
    rate_limited  BIGINT      NOT NULL,
    flagged       BIGINT      NOT NULL,
    last_at       TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (key_id, hour, policy_id)
);
-- All keys' bills scan an hour range; an account's bill its own rows.
CREATE INDEX usage_hourly_hour ON usage_hourly (hour);
CREATE INDEX usage_hourly_account_hour ON usage_hourly (account_id, hour);

INSERT INTO usage_hourly
SELECT e.key_id, k.account_id,
       date_trunc('hour', e.at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
       COALESCE(e.policy_id, ''),
       COUNT(*),
       COUNT(*) FILTER (WHERE e.billable),
       COALESCE(SUM(e.text_items) FILTER (WHERE e.billable), 0),
       COALESCE(SUM(e.text_chars) FILTER (WHERE e.billable), 0),
       COALESCE(SUM(e.image_items) FILTER (WHERE e.billable), 0),
       COALESCE(SUM(e.image_bytes) FILTER (WHERE e.billable), 0),
       COALESCE(SUM(e.deep_analyses) FILTER (WHERE e.billable), 0),
       COUNT(*) FILTER (WHERE e.rate_limited),
       COUNT(*) FILTER (WHERE e.flagged),
       MAX(e.at)
FROM usage_events e JOIN api_keys k ON k.id = e.key_id
GROUP BY 1, 2, 3, 4;

DROP TABLE usage_events_legacy;

-- Same columns and rows as before, now summed from the rollups (a day's
-- raw events may be gone to retention; its bill is not).
CREATE VIEW usage_billing_daily AS
SELECT key_id,
       (hour AT TIME ZONE 'UTC')::date    AS day,
       SUM(requests)::BIGINT              AS requests,
       SUM(text_items)::BIGINT            AS text_items,
       SUM(text_chars)::BIGINT            AS text_chars,
       SUM(image_items)::BIGINT           AS image_items,
       SUM(deep_analyses)::BIGINT         AS deep_analyses,
       SUM(rate_limited)::BIGINT          AS rate_limited
FROM usage_hourly
GROUP BY key_id, (hour AT TIME ZONE 'UTC')::date
HAVING SUM(requests) > 0 OR SUM(rate_limited) > 0;
