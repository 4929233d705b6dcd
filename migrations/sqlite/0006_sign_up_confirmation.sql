-- Open sign-up confirms the address: an account made at /dashboard/signup
-- has no password and waits until the one-time link sent to its e-mail is
-- followed (which sets the password). Until then nobody can sign in to it,
-- and a sign-up for the same address sends a new link instead of being
-- refused, so a stranger who typed someone else's address first does not
-- lock its owner out. Unconfirmed accounts whose links have all expired are
-- pruned.
ALTER TABLE accounts ADD COLUMN awaiting_confirmation INTEGER NOT NULL DEFAULT 0 CHECK (awaiting_confirmation IN (0, 1));
CREATE INDEX accounts_awaiting_confirmation ON accounts (created_at) WHERE awaiting_confirmation = 1;
