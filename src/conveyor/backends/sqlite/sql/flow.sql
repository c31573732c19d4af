-- What holds tasks back or lets them go: unique keys (their release,
-- on_conflict "replace"), pauses, the next due time, schedules, and
-- concurrency keys and rate limits (the keyed claim).
--
-- Named blocks of the SQLite backend; what their placeholders stand for is
-- said once, in conveyor.backends.sqlite.statements.

-- name: stored_key
-- The task holding a unique key, and whether its period is over (then
-- release_key frees the key for the enqueue that wants it).
select id, coalesce(unique_until <= :now, 0), state
from conveyor_tasks where name = :name and idempotency_key = :idempotency_key;

-- name: release_key
update conveyor_tasks set idempotency_key = null where id = :id;

-- name: replace_pending
-- on_conflict "replace": a pending holder takes the enqueue's payload,
-- priority and due time.
update conveyor_tasks
set payload = :payload, priority = :priority, run_at = coalesce(:run_at, :now + :delay)
where id = :id and state = 'pending'
returning queue;

-- name: paused
-- What the claims leave out: every paused queue and task name.
select kind, name from conveyor_pauses;

-- name: pause
-- Pause a queue or a task name (again: nothing changes); a row back if paused now.
insert into conveyor_pauses (kind, name, paused_at) values (:kind, :name, :now)
on conflict (kind, name) do nothing
returning 1;

-- name: resume
delete from conveyor_pauses where kind = :kind and name = :name returning 1;

-- name: list_pauses
select kind, name, paused_at from conveyor_pauses order by kind, name;

-- name: next_run_at
-- The earliest time a pending task of these queues becomes due.
select min(run_at) from conveyor_tasks
where state = 'pending' and queue in (select value from json_each(:queues));

-- name: sync_release
-- Record that a release of schedules synced at :now (its first sync gives it
-- the next generation: the rowid, one more than the greatest).
insert into conveyor_schedule_releases (release, tasks, seen_at)
values (:release, :tasks, :now)
on conflict (release) do update set seen_at = excluded.seen_at
returning generation;

-- name: release_superseded
-- Whether a newer release supersedes this one (see the PostgreSQL
-- statement sync_release): live, of a greater generation, and sharing one
-- of its task names (:tasks, a JSON array).
select exists (select 1 from conveyor_schedule_releases newer
               where newer.generation > :generation
                 and newer.seen_at >= :now - :lifetime
                 and exists (select 1 from json_each(newer.tasks) theirs
                             where theirs.value in (select value from json_each(:tasks))));

-- name: sync_schedule
-- Store a schedule as a release defines it (see the PostgreSQL statement).
insert into conveyor_schedules
    (name, task, cron, every_seconds, tz, missed, catch_up, args, fingerprint, last_slot,
     synced_at, release)
values (:name, :task, :cron, :every, :tz, :missed, :catch_up, :args, :fingerprint, :now, :now,
        :release)
on conflict (name) do update
set task = excluded.task, cron = excluded.cron, every_seconds = excluded.every_seconds,
    tz = excluded.tz, missed = excluded.missed, catch_up = excluded.catch_up,
    args = excluded.args, fingerprint = excluded.fingerprint, synced_at = excluded.synced_at,
    release = excluded.release
where (conveyor_schedules.release is not excluded.release
       or conveyor_schedules.fingerprint is not excluded.fingerprint)
  and not exists (select 1 from conveyor_schedule_releases owner
                  where owner.release = conveyor_schedules.release
                    and owner.generation > :generation
                    and owner.seen_at >= :now - :lifetime);

-- name: drop_schedules
-- Remove the stored schedules of these task names (a JSON array) that the
-- syncing release (its schedule names, a JSON array) no longer defines, but
-- for those a newer live release stored.
delete from conveyor_schedules
where task in (select value from json_each(:tasks))
  and name not in (select value from json_each(:names))
  and not exists (select 1 from conveyor_schedule_releases owner
                  where owner.release = conveyor_schedules.release
                    and owner.generation > :generation
                    and owner.seen_at >= :now - :lifetime);

-- name: list_schedules
select name, task, cron, every_seconds, tz, missed, catch_up, args, fingerprint,
       last_slot, last_task_id, synced_at, release
from conveyor_schedules
order by name;

-- name: fire_schedule
-- Take slots :first to :last of a schedule no one fired yet (see the
-- PostgreSQL statement; SQLite's one writer makes concurrent fires take turns).
update conveyor_schedules
set last_slot = :last
where name = :name and fingerprint = :fingerprint
  and (last_slot is null or last_slot < :first)
returning name;

-- name: fired_task
update conveyor_schedules set last_task_id = :task_id where name = :name;

-- name: open_keys
-- Up to :key_scan concurrency keys with pending tasks, claimed from longest
-- ago first, each with the room its running tasks leave (max_running less
-- them, but for an expired lease with nothing left to run: see the
-- PostgreSQL claim_keyed) and the tokens of its rate bucket now (null: no
-- rate).
select c.key,
       c.max_running - (
           select count(*) from conveyor_tasks r indexed by conveyor_tasks_running_keyed
           where r.concurrency_key = c.key and r.state = 'in_progress'
             and not (r.lease_expires_at <= :now
                      and (r.cancel_requested or r.spent >= r.max_attempts))),
       case when c.rate_limit is null then null
            else min(c.rate_limit * 1.0,
                     c.tokens + (:now - c.refilled_at) * c.rate_limit / c.rate_period) end,
       c.rate_limit
from conveyor_concurrency c
order by c.claimed_at is not null, c.claimed_at, c.key
limit :key_scan;

-- name: claim_keyed
-- The head of one key's due pending tasks, in claim order, at most its room.
select id, state, priority, run_at, concurrency_key, concurrency_limit
from conveyor_tasks indexed by conveyor_tasks_pending_keyed
where state = 'pending'
  and concurrency_key = :key
  and run_at <= :now
  and queue in (select value from json_each(:queues))
  and name in (select value from json_each(:names))
  and attempt <= 2147483645 and spent <= 2147483645  -- see quarantine
order by priority desc, run_at, id
limit :limit;

-- name: key_claimed
-- Mark a key claimed from (its turn comes last next time), with the limit
-- of its newest claimed task and the tokens left in its rate bucket.
update conveyor_concurrency
set claimed_at = :now, max_running = coalesce(:max_running, 1000000), tokens = :tokens,
    refilled_at = case when rate_limit is null then null else :now end
where key = :key;

-- name: keys_emptied
-- Keys with no pending task left lose their row (one with a rate once its
-- bucket is full again: :keys holds only those).
delete from conveyor_concurrency
where key in (select value from json_each(:keys))
  and not exists (select 1 from conveyor_tasks t
                  where t.concurrency_key = conveyor_concurrency.key and t.state = 'pending');
