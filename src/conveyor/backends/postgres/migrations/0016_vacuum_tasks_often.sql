-- Autovacuum comes to `tasks` after every twentieth of its rows changes,
-- not every fifth (PostgreSQL's default scale factor, 0.2).
--
-- Each claim leaves the entry of the task it claimed in the pending index
-- (tasks_pending_claim) until a vacuum removes it, and every later claim
-- steps over those entries: the claim's cost grows with the tasks claimed
-- since the last vacuum. With the default factor, that is a fifth of the
-- table, history included: with 8.8 million tasks kept, a claim of 200
-- read 9,251 index pages (35 ms) before a vacuum. A vacuum now comes at a
-- twentieth, as the workers' own vacuum (where autovacuum is off) does.
--
-- This sets the table's own storage parameter: an operator's value set
-- before this migration is replaced; one set after it stays. It takes a
-- lock that waits for a vacuum of `tasks` under way (claims and completions
-- do not wait for it).

alter table {schema}.tasks set (autovacuum_vacuum_scale_factor = 0.05);
