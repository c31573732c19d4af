-- The attempt that ends its task succeeded stays in its task row: the
-- completion keeps the row's attempt, worker_id, attempt_started_at and
-- step, stamps finished_at, and inserts no row into `attempts`. Every
-- other ended attempt (a failure, a lost lease, a timeout, an interruption,
-- a cancel, a step or poll after which the task goes on) still inserts its
-- row, since the task row then moves on to the next attempt. A succeeded
-- task never runs again, so its row keeps that attempt for as long as the
-- task is kept. The most common completion thus writes one row, not two:
-- no heap tuple and no key entry in `attempts`, and a prune deletes one row
-- fewer per succeeded task.
--
-- A task row may hold an owner without a lease: only a succeeded task, and
-- tasks_lease_iff_in_progress still holds (an owner *and* a lease exactly
-- in progress). Listings show no owner for it, as before.
--
-- `attempt_log` is the whole log of ended attempts: what readers of the log
-- (and queries of one's own) read instead of `attempts`. A filter on
-- task_id reaches both branches' primary keys.
--
-- Succeeded tasks completed before this migration keep their row in
-- `attempts` and have no owner in their task row, so the view shows each
-- ended attempt once. While workers of both versions run, an older
-- worker's reader does not show the succeeded attempts a newer worker
-- completed: upgrade every worker and reader at once to avoid it.

create view {schema}.attempt_log as
select task_id, number, worker_id, outcome, started_at, finished_at, error_type,
       error_message, traceback, step
from {schema}.attempts
union all
select id, attempt, worker_id, 'succeeded', coalesce(attempt_started_at, finished_at),
       finished_at, null, null, null, step
from {schema}.tasks
where state = 'succeeded' and worker_id is not null;
