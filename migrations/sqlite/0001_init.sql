-- Timestamps are TEXT in one fixed RFC 3339 UTC form,
-- 'YYYY-MM-DDTHH:MM:SS.ffffffZ', so that text order is time order and
-- date(at) is the UTC day. Booleans are 0/1.

-- API keys. The secret itself is never stored, only a keyed hash of it.
CREATE TABLE api_keys (
    id          TEXT    PRIMARY KEY
                        CHECK (length(id) = 16 AND id NOT GLOB '*[^0-9a-f]*'),
    name        TEXT    NOT NULL,
    tier        TEXT    NOT NULL CHECK (tier IN ('free', 'basic', 'pro', 'enterprise')),
    custom_rpm  INTEGER NULL CHECK (custom_rpm > 0),
    secret_hash BLOB    NOT NULL,
    created_at  TEXT    NOT NULL CHECK (created_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T*Z'),
    revoked_at  TEXT    NULL CHECK (revoked_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T*Z')
) STRICT;

-- One row per metered request; request_id makes retried batches idempotent.
CREATE TABLE usage_events (
    request_id    TEXT    PRIMARY KEY,
    key_id        TEXT    NOT NULL REFERENCES api_keys (id),
    at            TEXT    NOT NULL CHECK (at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T*Z'),
    status        INTEGER NOT NULL CHECK (status BETWEEN 0 AND 65535),
    text_items    INTEGER NOT NULL CHECK (text_items >= 0),
    text_chars    INTEGER NOT NULL CHECK (text_chars >= 0),
    image_items   INTEGER NOT NULL CHECK (image_items >= 0),
    image_bytes   INTEGER NOT NULL CHECK (image_bytes >= 0),
    deep_analyses INTEGER NOT NULL CHECK (deep_analyses >= 0),
    flagged       INTEGER NOT NULL CHECK (flagged IN (0, 1)),
    rate_limited  INTEGER NOT NULL CHECK (rate_limited IN (0, 1)),
    billable      INTEGER NOT NULL CHECK (billable IN (0, 1)),
    latency_ms    INTEGER NOT NULL CHECK (latency_ms >= 0)
) STRICT;

-- Per-key reads and billing scan a key's time range.
CREATE INDEX usage_events_key_at ON usage_events (key_id, at);
-- All-keys reads (billing since a day, export) scan by time.
CREATE INDEX usage_events_at ON usage_events (at);

-- Billable usage per key and UTC day ('YYYY-MM-DD'), for billing jobs
-- reading SQL directly. Only days with billable or rate-limited requests
-- appear.
CREATE VIEW usage_billing_daily AS
SELECT key_id,
       date(at)                                              AS day,
       SUM(billable)                                         AS requests,
       SUM(CASE WHEN billable = 1 THEN text_items ELSE 0 END)    AS text_items,
       SUM(CASE WHEN billable = 1 THEN text_chars ELSE 0 END)    AS text_chars,
       SUM(CASE WHEN billable = 1 THEN image_items ELSE 0 END)   AS image_items,
       SUM(CASE WHEN billable = 1 THEN deep_analyses ELSE 0 END) AS deep_analyses,
       SUM(rate_limited)                                     AS rate_limited
FROM usage_events
WHERE billable = 1 OR rate_limited = 1
GROUP BY key_id, date(at);
