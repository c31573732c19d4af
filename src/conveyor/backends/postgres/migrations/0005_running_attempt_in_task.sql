-- One write to the attempt log per attempt: the running attempt lives in its
-- task row (attempt, worker_id, step and now attempt_started_at), and its
-- ending, or the reclaim that finds its lease expired, inserts its one row.
-- Before, the claim inserted a row that the ending then updated: two writes
-- and two index entries per attempt.
--
-- Adding a column without a default rewrites nothing. Open rows of attempts
-- that started before this migration stay: the worker that claimed them
-- closes them in place, a reclaim's insert updates a conflicting open row,
-- and readers of the log show an open row instead of the task row's copy.
-- While workers of both versions run, a reclaim by an older worker of an
-- attempt a newer one claimed finds no row to close, so that lease_lost
-- entry is missing from the log: upgrade every worker at once to avoid it.

alter table {schema}.tasks add column attempt_started_at timestamptz;
