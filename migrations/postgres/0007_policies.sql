-- Policies (issue 24): an account's own choice, per category, of "off" or a
-- threshold that replaces the shipped one. `rules` is JSON text holding only
-- the categories with a rule: {"hate": 0.3, "violence": "off"}; the
-- application checks it on the way in and on the way out. A policy is never
-- deleted, so usage rows and history can always name it.
-- (0006 is e-mail confirmation of sign-up, made on another branch.)
CREATE TABLE policies (
    id         TEXT    PRIMARY KEY,
    account_id TEXT    NOT NULL REFERENCES accounts (id),
    name       TEXT    NOT NULL,
    -- 1 when made, one more at every change: responses name it, so a
    -- client can tell which version judged a text.
    version    INTEGER NOT NULL CHECK (version > 0),
    rules      TEXT    NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    UNIQUE (account_id, name)
);

-- Every version of every policy, the first included: what it said, who
-- changed it (an e-mail address, or `cli`) and when.
CREATE TABLE policy_versions (
    policy_id  TEXT    NOT NULL REFERENCES policies (id),
    version    INTEGER NOT NULL CHECK (version > 0),
    name       TEXT    NOT NULL,
    rules      TEXT    NOT NULL,
    changed_by TEXT    NOT NULL,
    changed_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (policy_id, version)
);

-- The policy of the account's keys that name none of their own; NULL: the
-- shipped thresholds. That a policy is the account's own is checked by the
-- statements that set these columns, and again when a key is read (a
-- policy of another account is never applied).
ALTER TABLE accounts ADD COLUMN default_policy_id TEXT NULL REFERENCES policies (id);
ALTER TABLE api_keys ADD COLUMN policy_id TEXT NULL REFERENCES policies (id);

-- The policy each metered request was judged under (NULL: none). No
-- reference: a usage row must never be refused (policies are not deleted
-- anyway).
ALTER TABLE usage_events ADD COLUMN policy_id TEXT NULL;
