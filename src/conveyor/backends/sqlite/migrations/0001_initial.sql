-- Tasks, the attempt log and the workers table, in one SQLite file.
--
-- Same shape as the PostgreSQL schema. Times are REAL seconds since the Unix
-- epoch (UTC), read from SQLite's clock: comparable, ordered and cheap.
-- Tables carry a conveyor_ prefix, so they can live in an application's own
-- database file next to its tables (transactional enqueue needs that).

create table conveyor_tasks (
    -- autoincrement: an id is never reused, even after rows are deleted.
    id                integer primary key autoincrement,
    name              text not null,
    queue             text not null,
    payload           text not null,
    state             text not null default 'pending'
        check (state in ('pending', 'in_progress', 'waiting', 'succeeded', 'failed', 'cancelled')),
    priority          integer not null default 0,
    run_at            real not null,
    -- The number of the latest attempt (0 before the first claim): the lease token.
    attempt           integer not null default 0,
    -- Attempts counted against max_attempts (see the PostgreSQL schema).
    spent             integer not null default 0,
    max_attempts      integer not null check (max_attempts >= 1),
    retry_policy      text not null,
    timeout_seconds   real,
    lease_seconds     real,
    worker_id         text,
    lease_expires_at  real,
    cancel_requested  integer not null default 0,
    result            text,
    created_at        real not null,
    finished_at       real,
    -- Exactly the in-progress tasks have an owner and a lease: the fences of
    -- heartbeat and finish rely on it.
    constraint tasks_lease_iff_in_progress check (
        (state = 'in_progress') = (worker_id is not null and lease_expires_at is not null))
);

-- The claim path for due work, holding only pending rows.
create index conveyor_tasks_pending_claim on conveyor_tasks (queue, priority desc, run_at, id)
    where state = 'pending';

-- The reclaim path: leases by expiry, only rows in progress.
create index conveyor_tasks_in_progress_lease on conveyor_tasks (lease_expires_at)
    where state = 'in_progress';

-- Listings by state, newest first.
create index conveyor_tasks_state_id on conveyor_tasks (state, id desc);

create table conveyor_attempts (
    task_id        integer not null references conveyor_tasks (id) on delete cascade,
    number         integer not null,
    worker_id      text not null,
    outcome        text not null default 'in_progress'
        check (outcome in ('in_progress', 'succeeded', 'failed', 'lease_lost',
                           'timed_out', 'cancelled', 'interrupted')),
    started_at     real not null,
    finished_at    real,
    error_type     text,
    error_message  text,
    traceback      text,
    primary key (task_id, number)
) without rowid;

create table conveyor_workers (
    id            text primary key,
    host          text not null,
    pid           integer not null,
    -- A JSON array of queue names.
    queues        text not null,
    concurrency   integer not null,
    started_at    real not null,
    last_seen_at  real not null,
    stopped_at    real
);
