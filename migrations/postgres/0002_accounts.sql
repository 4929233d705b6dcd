-- Accounts: who owns API keys and signs in to the dashboard. A key's plan is
-- its account's plan (copied onto the key, so the API's key path is unchanged).
CREATE TABLE accounts (
    id            TEXT        PRIMARY KEY,
    -- Lower-cased by the application before it gets here.
    email         TEXT        NOT NULL UNIQUE,
    -- PHC string (argon2id); NULL: nobody can sign in as this account.
    password_hash TEXT        NULL,
    role          TEXT        NOT NULL CHECK (role IN ('admin', 'customer')),
    tier          TEXT        NOT NULL CHECK (tier IN ('free', 'basic', 'pro', 'enterprise')),
    custom_rpm    INTEGER     NULL CHECK (custom_rpm > 0),
    disabled_at   TIMESTAMPTZ NULL,
    created_at    TIMESTAMPTZ NOT NULL
);

-- Keys made before accounts existed, and keys made by `moderato keys create`,
-- belong to the operator account. It has no password, and its plan is not
-- copied onto its keys (each CLI key keeps its own).
INSERT INTO accounts (id, email, password_hash, role, tier, custom_rpm, disabled_at, created_at)
VALUES ('00000000-0000-0000-0000-000000000000', 'operator@localhost', NULL, 'admin', 'free',
        NULL, NULL, now());

ALTER TABLE api_keys
    ADD COLUMN account_id TEXT NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000'
        REFERENCES accounts (id);
CREATE INDEX api_keys_account ON api_keys (account_id);

-- Dashboard sessions, shared by every replica. Only a SHA-256 of the session
-- id is stored, so a read of this table does not give anyone a session.
CREATE TABLE dashboard_sessions (
    id_hash    BYTEA       PRIMARY KEY,
    account_id TEXT        NOT NULL REFERENCES accounts (id),
    csrf_token TEXT        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    last_seen  TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX dashboard_sessions_account ON dashboard_sessions (account_id);

-- Failed sign-ins, for the lockout (per account email and per address).
CREATE TABLE sign_in_failures (
    id      BIGSERIAL   PRIMARY KEY,
    email   TEXT        NOT NULL,
    address TEXT        NOT NULL,
    at      TIMESTAMPTZ NOT NULL
);
CREATE INDEX sign_in_failures_email_at ON sign_in_failures (email, at);
CREATE INDEX sign_in_failures_address_at ON sign_in_failures (address, at);

-- One-time links to set a password (first password of an account made by an
-- admin). Only a SHA-256 of the token is stored.
CREATE TABLE password_tokens (
    token_hash BYTEA       PRIMARY KEY,
    account_id TEXT        NOT NULL REFERENCES accounts (id),
    expires_at TIMESTAMPTZ NOT NULL
);
