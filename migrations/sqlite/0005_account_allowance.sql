-- A plan's allowance belongs to its account: every key of a customer
-- account draws on the account's requests and characters per minute, and
-- the plan is read from the account's row, no longer copied onto its keys.
-- Until now a customer key's custom_rpm was such a copy of its account's;
-- from now on it is a lower limit of the key's own (never above the
-- account's, which the service enforces), so the copies go. Operator keys
-- (made by `moderato keys create`) keep their own plans.
UPDATE api_keys SET custom_rpm = NULL
WHERE account_id <> '00000000-0000-0000-0000-000000000000';
