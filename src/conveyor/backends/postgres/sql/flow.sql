-- What holds tasks back or lets them go: unique keys (their locks, their
-- release, on_conflict "replace"), concurrency keys and rate limits (the
-- keyed claim), pauses, the next due time, and schedules.
--
-- Named blocks of the PostgreSQL backend; what their placeholders stand for is
-- said once, in conveyor.backends.postgres.statements.

-- name: lock_unique_keys
-- The unique keys of a batch, locked (advisory, until commit) in one order
-- before anything is inserted. Two enqueues of the same keys in different
-- orders would otherwise deadlock on the unique index, each waiting for a
-- key the other inserted first; now the later one waits for the earlier's
-- commit before it inserts anything. Keys fold into 32-bit hashes (two keys
-- sharing one only wait for each other) in a space apart from guard_send's.
select count(pg_advisory_xact_lock(({lock_space} # 1), k.h))
from (select distinct hashtext(k.name || chr(31) || k.key) as h
      from unnest(%(names)s::text[], %(keys)s::text[]) as k(name, key)
      where k.key is not null
      order by h) as k;

-- name: ensure_keys
-- The concurrency rows of a batch's keys, made in key order before its tasks
-- are inserted (the trigger then finds them). Inserting a new key waits for
-- another transaction that inserted the same key, uncommitted; two enqueues
-- of new keys in different orders would otherwise deadlock. A key's limit and
-- rate come from the batch's first task with it, as the trigger does. Keys
-- whose row this statement sees are left out: an insert that meets a row
-- another transaction changed, uncommitted (a new limit), would wait for it.
insert into {schema}.concurrency (key, max_running, rate_limit, rate_period, tokens, refilled_at)
select distinct on (k.key)
       k.key, coalesce(k.max_running, 1000000), k.rate_limit, k.rate_period, k.rate_limit,
       statement_timestamp()
from unnest(%(concurrency_keys)s::text[], %(concurrency_limits)s::int[],
            %(rate_limits)s::int[], %(rate_periods)s::float8[])
    with ordinality as k(key, max_running, rate_limit, rate_period, ord)
where k.key is not null
  and not exists (select 1 from {schema}.concurrency c where c.key = k.key)
order by k.key, k.ord
on conflict (key) do nothing
returning key;

-- name: drop_unused_keys
-- After a batch some of whose tasks found their unique key taken: the rows
-- ensure_keys made (%(keys)s::text[]) for keys no pending task has. Without
-- a task, a key has no row: the next task of the key makes it, with its own
-- limit and rate.
delete from {schema}.concurrency c
where c.key = any(%(keys)s::text[])
  and not exists (select 1 from {schema}.tasks t
                  where t.concurrency_key = c.key and t.state = 'pending');

-- name: release_keys
-- Unique keys whose period has ended give way to the enqueue that wants
-- them: cleared, so that enqueue_keyed (next, in the same transaction)
-- stores a new task under each.
update {schema}.tasks t
set idempotency_key = null
from unnest(%(names)s::text[], %(keys)s::text[]) as k(name, key)
where t.name = k.name and t.idempotency_key = k.key
  and t.unique_until <= coalesce(%(now)s::timestamptz, statement_timestamp());

-- name: replace_pending
-- on_conflict "replace": the holders that are still pending take the
-- payload, priority and due time of the enqueue that found them.
update {schema}.tasks t
set payload = r.payload::jsonb,
    priority = r.priority,
    run_at = coalesce(r.run_at,
                      coalesce(%(now)s::timestamptz, statement_timestamp())
                      + make_interval(secs => r.delay))
from unnest(%(ids)s::bigint[], %(payloads)s::text[], %(priorities)s::int[],
            %(run_ats)s::timestamptz[], %(delays)s::float8[])
    as r(id, payload, priority, run_at, delay)
where t.id = r.id and t.state = 'pending'
returning t.id, t.queue;

-- name: stored_keys
-- The tasks holding these names' unique keys, and whether each one's
-- period is over (release_keys then frees the key).
select t.name, t.idempotency_key, t.id,
       coalesce(t.unique_until <= coalesce(%(now)s::timestamptz, statement_timestamp()), false)
from {schema}.tasks t
join unnest(%(names)s::text[], %(keys)s::text[]) as k(name, key)
  on t.name = k.name and t.idempotency_key = k.key;

-- name: pause
-- Pause a queue or a task name (again: nothing changes). Whether it was
-- paused now comes back.
insert into {schema}.pauses (kind, name, paused_at)
values (%(kind)s, %(name)s, coalesce(%(now)s::timestamptz, statement_timestamp()))
on conflict (kind, name) do nothing
returning true;

-- name: resume
-- Resume a queue or a task name, and wake the idle workers of the queues
-- it holds back (a queue: itself; a name: each queue with due tasks of it).
with resumed as (
    delete from {schema}.pauses where kind = %(kind)s and name = %(name)s
    returning kind, name
),
woken as (
    select r.name as queue from resumed r where r.kind = 'queue'
    union
    select distinct t.queue from {schema}.tasks t, resumed r
    where r.kind = 'task' and t.state = 'pending' and t.name = r.name
)
select (select count(*) from resumed), (select count(pg_notify({channel}, queue)) from woken);

-- name: list_pauses
select kind, name, paused_at from {schema}.pauses order by kind, name;

-- name: next_run_at
-- The earliest time a pending task of these queues becomes due.
select min(run_at) from {schema}.tasks
where state = 'pending' and queue = any(%(queues)s::text[]);

-- name: sync_release
-- Record that a release of schedules synced now (its first sync gives it the
-- next generation), and say whether a newer one supersedes it: a live
-- release (synced within %(lifetime)s seconds) of a greater generation that
-- shares one of its task names, a newer release of the same app. Then the
-- sync writes nothing else.
with synced as (
    insert into {schema}.schedule_releases (release, tasks, seen_at)
    values (%(release)s, %(tasks)s::text[],
            coalesce(%(now)s::timestamptz, statement_timestamp()))
    on conflict (release) do update set seen_at = excluded.seen_at
    returning generation, seen_at
)
select generation,
       exists (select from {schema}.schedule_releases newer
               where newer.generation > synced.generation
                 and newer.seen_at >= synced.seen_at - make_interval(secs => %(lifetime)s)
                 and newer.tasks && %(tasks)s::text[])
from synced;

-- name: part_newer_owner
-- Part of the writes of a sync: the stored schedule's release is live and
-- of a greater generation than the syncing one's (another app's newer
-- release stored that name), so the sync leaves the row alone.
exists (select from {schema}.schedule_releases owner
        where owner.release = {schema}.schedules.release
          and owner.generation > %(generation)s
          and owner.seen_at >= coalesce(%(now)s::timestamptz, statement_timestamp())
                               - make_interval(secs => %(lifetime)s))

-- name: sync_schedule
-- Store a schedule as a release defines it: a new one starts from now (it
-- does not fire for slots before it existed); a changed one keeps its last
-- slot; one a newer live release stored stays as it is, and so does one
-- this release stored already (a running worker's syncs write no row then:
-- synced_at is when its release stored it).
insert into {schema}.schedules
    (name, task, cron, every_seconds, tz, missed, catch_up, args, fingerprint, last_slot,
     synced_at, release)
values (%(name)s, %(task)s, %(cron)s, %(every)s, %(tz)s, %(missed)s, %(catch_up)s,
        %(args)s::jsonb, %(fingerprint)s,
        coalesce(%(now)s::timestamptz, statement_timestamp()),
        coalesce(%(now)s::timestamptz, statement_timestamp()), %(release)s)
on conflict (name) do update
set task = excluded.task, cron = excluded.cron, every_seconds = excluded.every_seconds,
    tz = excluded.tz, missed = excluded.missed, catch_up = excluded.catch_up,
    args = excluded.args, fingerprint = excluded.fingerprint, synced_at = excluded.synced_at,
    release = excluded.release
where ({schema}.schedules.release, {schema}.schedules.fingerprint)
      is distinct from (excluded.release, excluded.fingerprint)
  and not {part_newer_owner};

-- name: drop_schedules
-- Remove the stored schedules of these task names that the syncing release
-- no longer defines (schedules of other apps' task names stay, and so do
-- those a newer live release stored).
delete from {schema}.schedules
where task = any(%(tasks)s::text[]) and not (name = any(%(names)s::text[]))
  and not {part_newer_owner};

-- name: list_schedules
select name, task, cron, every_seconds, tz, missed, catch_up, args::text, fingerprint,
       last_slot, last_task_id, synced_at, release, statement_timestamp()
from {schema}.schedules
order by name;

-- name: fire_schedule
-- Take the slots %(first)s to %(last)s of a schedule whose stored definition
-- is this worker's (its fingerprint) and that no one fired yet: the row
-- lock makes concurrent fires of one schedule take turns, and the second
-- finds last_slot moved on. A row back: these slots are this caller's to
-- enqueue, in the same transaction.
update {schema}.schedules
set last_slot = %(last)s::timestamptz
where name = %(name)s and fingerprint = %(fingerprint)s
  and (last_slot is null or last_slot < %(first)s::timestamptz)
returning name;

-- name: fired_task
update {schema}.schedules set last_task_id = %(task_id)s where name = %(name)s;

-- name: keys_waiting
-- Whether any concurrency key has pending tasks (a row of its own): only
-- then does a worker run the keyed claim.
select exists (select 1 from {schema}.concurrency);

-- name: lock_keys
-- The first statement of a keyed claim: lock up to %(key_scan)s key rows,
-- those claimed from longest ago first (every key gets its turn), passing by
-- keys another claim, or a writer making a task of the key pending, holds.
select c.key from {schema}.concurrency c
order by c.claimed_at nulls first, c.key
limit %(key_scan)s::int
for update skip locked;

-- name: claim_keyed
-- The second statement of a keyed claim, its snapshot taken after the key
-- rows %(keys)s were locked: up to %(limit)s due pending tasks of those
-- keys, each key at most its room (max_running less its running tasks, read
-- off tasks_running_keyed), in claim order, started as the plain claim
-- starts its tasks. The keys claimed from are marked (their turn comes
-- last next time, and take the limit of their newest claimed task); keys
-- with no pending task left lose their row.
with clock as (
    select coalesce(%(now)s::timestamptz, statement_timestamp()) as now
),
{part_served},
bucket as materialized (
    select c.key, c.max_running, c.rate_limit,
           least(c.rate_limit::float8,
                 c.tokens + extract(epoch from clock.now - c.refilled_at)
                            * c.rate_limit / c.rate_period) as tokens
    from {schema}.concurrency c, clock
    where c.key = any(%(keys)s::text[])
),
-- A running task counts against its key's room unless its lease expired
-- with nothing left to run (the next sweep ends it; it may write nothing).
open_keys as materialized (
    select b.key, b.tokens,
           least(b.max_running - (select count(*) from {schema}.tasks r, clock
                                  where r.concurrency_key = b.key and r.state = 'in_progress'
                                    and not (r.lease_expires_at <= clock.now
                                             and (r.cancel_requested
                                                  or r.spent >= r.max_attempts))),
                 coalesce(floor(b.tokens)::bigint, %(limit)s::int)) as room
    from bucket b
),
keyed_due as materialized (
    select p.id, p.priority, p.run_at, k.key
    from open_keys k
    cross join served s
    cross join lateral (
        select t.id, t.priority, t.run_at
        from {schema}.tasks t, clock
        where t.concurrency_key = k.key
          and t.state = 'pending'
          and t.run_at <= clock.now
          and t.queue = any(s.queues)
          and t.name = any(s.names)
          and t.attempt <= 2147483645 and t.spent <= 2147483645  -- see quarantine
        order by t.priority desc, t.run_at, t.id
        limit greatest(least(k.room, %(limit)s::int), 0)
        for no key update of t skip locked
    ) as p
),
chosen as (
    select id from keyed_due
    order by priority desc, run_at, id
    limit %(limit)s::int
),
{part_claimed},
marked as (
    update {schema}.concurrency c
    set claimed_at = clock.now,
        max_running = coalesce(
            (select coalesce(t.concurrency_limit, 1000000) from claimed t
             where t.concurrency_key = c.key order by t.id desc limit 1),
            c.max_running),
        tokens = o.tokens - (select count(*) from claimed t where t.concurrency_key = c.key),
        refilled_at = case when c.rate_limit is null then null else clock.now end
    from clock, open_keys o
    where o.key = c.key
      and c.key in (select d.key from keyed_due d join chosen x on x.id = d.id)
),
emptied as (
    delete from {schema}.concurrency c
    using open_keys o
    where o.key = c.key
      and c.key not in (select d.key from keyed_due d)
      and (c.rate_limit is null or o.tokens >= c.rate_limit)
      and not exists (select 1 from {schema}.tasks t
                      where t.concurrency_key = c.key and t.state = 'pending')
)
select id, attempt, name, queue, payload, spent, max_attempts, retry_policy,
       timeout_seconds, lease_seconds, lease_expires_at, step, parent_id, run_at, trace_context,
       expired_at, receives, {part_claim_inbox}
from claimed
order by priority desc, run_at, id;
