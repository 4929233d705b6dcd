-- Hourly rollups of usage per key and policy (issue #57), as on
-- PostgreSQL, which billing, the usage page and its CSV read instead of the
-- raw events. SQLite keeps one events table (no partitioning); a trigger
-- adds each stored event to its rollup in the inserting transaction, and
-- fires only for rows actually inserted (a retried event skipped by ON
-- CONFLICT DO NOTHING is not counted twice).
--
-- `hour` is the UTC hour in the events' timestamp form
-- ('YYYY-MM-DDTHH:00:00.000000Z'); `policy_id` is '' for "no policy";
-- `requests` and the item counts are of billable requests only, `events`
-- counts every metered request and `last_at` is the latest.
CREATE TABLE usage_hourly (
    key_id        TEXT    NOT NULL,
    account_id    TEXT    NOT NULL,
    hour          TEXT    NOT NULL,
    policy_id     TEXT    NOT NULL DEFAULT '',
    events        INTEGER NOT NULL,
    requests      INTEGER NOT NULL,
    text_items    INTEGER NOT NULL,
    text_chars    INTEGER NOT NULL,
    image_items   INTEGER NOT NULL,
    image_bytes   INTEGER NOT NULL,
    deep_analyses INTEGER NOT NULL,
    rate_limited  INTEGER NOT NULL,
    flagged       INTEGER NOT NULL,
    last_at       TEXT    NOT NULL,
    PRIMARY KEY (key_id, hour, policy_id)
) STRICT;
CREATE INDEX usage_hourly_hour ON usage_hourly (hour);
CREATE INDEX usage_hourly_account_hour ON usage_hourly (account_id, hour);

INSERT INTO usage_hourly
SELECT e.key_id, k.account_id, substr(e.at, 1, 13) || ':00:00.000000Z', COALESCE(e.policy_id, ''),
       COUNT(*), SUM(e.billable),
       SUM(e.billable * e.text_items), SUM(e.billable * e.text_chars),
       SUM(e.billable * e.image_items), SUM(e.billable * e.image_bytes),
       SUM(e.billable * e.deep_analyses), SUM(e.rate_limited), SUM(e.flagged), MAX(e.at)
FROM usage_events e JOIN api_keys k ON k.id = e.key_id
GROUP BY 1, 2, 3, 4;

CREATE TRIGGER usage_events_rollup AFTER INSERT ON usage_events
BEGIN
    INSERT INTO usage_hourly (key_id, account_id, hour, policy_id, events, requests,
        text_items, text_chars, image_items, image_bytes, deep_analyses, rate_limited,
        flagged, last_at)
    -- An unknown key ('' here) is refused by the events' foreign key at
    -- the end of the statement, which undoes this row too: the writer
    -- sees the same constraint error as before the rollups.
    VALUES (NEW.key_id, COALESCE((SELECT account_id FROM api_keys WHERE id = NEW.key_id), ''),
        substr(NEW.at, 1, 13) || ':00:00.000000Z', COALESCE(NEW.policy_id, ''), 1,
        NEW.billable, NEW.billable * NEW.text_items, NEW.billable * NEW.text_chars,
        NEW.billable * NEW.image_items, NEW.billable * NEW.image_bytes,
        NEW.billable * NEW.deep_analyses, NEW.rate_limited, NEW.flagged, NEW.at)
    ON CONFLICT (key_id, hour, policy_id) DO UPDATE SET
        events = events + excluded.events,
        requests = requests + excluded.requests,
        text_items = text_items + excluded.text_items,
        text_chars = text_chars + excluded.text_chars,
        image_items = image_items + excluded.image_items,
        image_bytes = image_bytes + excluded.image_bytes,
        deep_analyses = deep_analyses + excluded.deep_analyses,
        rate_limited = rate_limited + excluded.rate_limited,
        flagged = flagged + excluded.flagged,
        last_at = max(last_at, excluded.last_at);
END;

-- Same columns and rows as before, now summed from the rollups (raw events
-- past the retention are gone; their bills are not).
DROP VIEW usage_billing_daily;
CREATE VIEW usage_billing_daily AS
SELECT key_id,
       date(hour)          AS day,
       SUM(requests)       AS requests,
       SUM(text_items)     AS text_items,
       SUM(text_chars)     AS text_chars,
       SUM(image_items)    AS image_items,
       SUM(deep_analyses)  AS deep_analyses,
       SUM(rate_limited)   AS rate_limited
FROM usage_hourly
GROUP BY key_id, date(hour)
HAVING SUM(requests) > 0 OR SUM(rate_limited) > 0;
