-- Device cookies (OWASP, "Slow Down Online Guessing Attacks with Device
-- Cookies"): a browser that signed in to an account gets a long-lived random
-- token; while the account is locked by failed sign-ins, only a browser
-- holding a valid one for that account may still try a password. Only a
-- SHA-256 of the token is stored.
CREATE TABLE dashboard_devices (
    token_hash BYTEA       PRIMARY KEY,
    account_id TEXT        NOT NULL REFERENCES accounts (id),
    created_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX dashboard_devices_account ON dashboard_devices (account_id);

-- A failure made with a valid device cookie of the account counts against
-- that device (its own lockout), not against the account's: NULL otherwise.
ALTER TABLE sign_in_failures ADD COLUMN device_hash BYTEA NULL;
CREATE INDEX sign_in_failures_device_at ON sign_in_failures (device_hash, at);

-- Sign-ups per client address, for the bound on open sign-up.
CREATE TABLE sign_ups (
    id      BIGSERIAL   PRIMARY KEY,
    address TEXT        NOT NULL,
    at      TIMESTAMPTZ NOT NULL
);
CREATE INDEX sign_ups_address_at ON sign_ups (address, at);
