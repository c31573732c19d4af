-- Tasks, the attempt log and the workers table.
--
-- A task row holds the fixed facts of one enqueue (name, payload, options)
-- and its current state. Every claim inserts an attempt row; the attempt's
-- number is the lease token that fences every later write about the task.

create table {schema}.tasks (
    id                bigint generated always as identity primary key,
    name              text not null,
    queue             text not null,
    payload           jsonb not null,
    state             text not null default 'pending'
        check (state in ('pending', 'in_progress', 'waiting', 'succeeded', 'failed', 'cancelled')),
    priority          integer not null default 0,
    run_at            timestamptz not null default now(),
    -- The number of the latest attempt (0 before the first claim): the lease token.
    attempt           integer not null default 0,
    -- Attempts counted against max_attempts: claims and reclaims, minus the ones a
    -- graceful shutdown interrupted; reset by a manual retry.
    spent             integer not null default 0,
    max_attempts      integer not null check (max_attempts >= 1),
    retry_policy      jsonb not null,
    timeout_seconds   double precision,
    lease_seconds     double precision,
    worker_id         text,
    lease_expires_at  timestamptz,
    cancel_requested  boolean not null default false,
    result            jsonb,
    created_at        timestamptz not null default now(),
    finished_at       timestamptz,
    -- Exactly the in-progress tasks have an owner and a lease: the fences of
    -- heartbeat and finish rely on it.
    constraint tasks_lease_iff_in_progress check (
        (state = 'in_progress') = (worker_id is not null and lease_expires_at is not null))
);

-- The claim path for due work: one queue at a time, in claim order. Only
-- pending rows are in it, so it stays small however much history piles up.
create index tasks_pending_claim on {schema}.tasks (queue, priority desc, run_at, id)
    where state = 'pending';

-- The reclaim path: leases by expiry, only rows in progress.
create index tasks_in_progress_lease on {schema}.tasks (lease_expires_at)
    where state = 'in_progress';

-- Listings by state, newest first.
create index tasks_state_id on {schema}.tasks (state, id desc);

create table {schema}.attempts (
    task_id        bigint not null references {schema}.tasks (id) on delete cascade,
    number         integer not null,
    worker_id      text not null,
    outcome        text not null default 'in_progress'
        check (outcome in ('in_progress', 'succeeded', 'failed', 'lease_lost',
                           'timed_out', 'cancelled', 'interrupted')),
    started_at     timestamptz not null default now(),
    finished_at    timestamptz,
    error_type     text,
    error_message  text,
    traceback      text,
    primary key (task_id, number)
);

create table {schema}.workers (
    id            text primary key,
    host          text not null,
    pid           integer not null,
    queues        text[] not null,
    concurrency   integer not null,
    started_at    timestamptz not null default now(),
    last_seen_at  timestamptz not null default now(),
    stopped_at    timestamptz
);

-- Wake idle workers when due work arrives: one notification per queue per
-- statement (bulk enqueue sends one, not thousands). The payload is only
-- the queue name; workers claim through the normal path. The clock here is
-- clock_timestamp(): an enqueue stamps run_at with statement_timestamp(),
-- which is later than now() (the transaction start), so comparing with
-- now() would miss every task enqueued for "right away".
create function {schema}.notify_due_tasks() returns trigger
language plpgsql as $$
begin
    perform pg_notify('conveyor_' || tg_table_schema, q.queue)
    from (select distinct queue from new_rows
          where state = 'pending' and run_at <= clock_timestamp()) as q;
    return null;
end
$$;

create trigger tasks_notify_insert
    after insert on {schema}.tasks
    referencing new table as new_rows
    for each statement execute function {schema}.notify_due_tasks();
