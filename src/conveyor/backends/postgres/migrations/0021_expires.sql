-- A task's expiry time (the `expires` option): a claim that starts its
-- first attempt after it hands the task over marked expired, and the
-- worker ends it cancelled without running it. NULL: it never expires.

alter table {schema}.tasks add column expires_at timestamptz;
