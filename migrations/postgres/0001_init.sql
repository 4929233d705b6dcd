-- API keys. The secret itself is never stored, only a keyed hash of it.
CREATE TABLE api_keys (
    id          TEXT        PRIMARY KEY CHECK (id ~ '^[0-9a-f]{16}$'),
    name        TEXT        NOT NULL,
    tier        TEXT        NOT NULL CHECK (tier IN ('free', 'basic', 'pro', 'enterprise')),
    custom_rpm  INTEGER     NULL CHECK (custom_rpm > 0),
    secret_hash BYTEA       NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    revoked_at  TIMESTAMPTZ NULL
);

-- One row per metered request; request_id makes retried batches idempotent.
-- Counters are BIGINT so that every u32/u64 the server produces fits.
CREATE TABLE usage_events (
    request_id    TEXT        PRIMARY KEY,
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
    latency_ms    BIGINT      NOT NULL CHECK (latency_ms >= 0)
);

-- Per-key reads and billing scan a key's time range.
CREATE INDEX usage_events_key_at ON usage_events (key_id, at);
-- All-keys reads (billing since a day, export) scan by time.
CREATE INDEX usage_events_at ON usage_events (at);

-- Billable usage per key and UTC day, for billing jobs reading SQL directly.
-- Only days with billable or rate-limited requests appear.
CREATE VIEW usage_billing_daily AS
SELECT key_id,
       (at AT TIME ZONE 'UTC')::date                              AS day,
       COUNT(*) FILTER (WHERE billable)                           AS requests,
       COALESCE(SUM(text_items) FILTER (WHERE billable), 0)::BIGINT    AS text_items,
       COALESCE(SUM(text_chars) FILTER (WHERE billable), 0)::BIGINT    AS text_chars,
       COALESCE(SUM(image_items) FILTER (WHERE billable), 0)::BIGINT   AS image_items,
       COALESCE(SUM(deep_analyses) FILTER (WHERE billable), 0)::BIGINT AS deep_analyses,
       COUNT(*) FILTER (WHERE rate_limited)                       AS rate_limited
FROM usage_events
WHERE billable OR rate_limited
GROUP BY key_id, (at AT TIME ZONE 'UTC')::date;
