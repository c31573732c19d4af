-- Statements of the peer benchmark (benchmarks/peers.py). Each completion
-- block reads one system's own tables after a drain and returns
-- (succeeded, unfinished, first start, last finish); every system runs in a
-- database of its own, so no block needs to tell drains apart.

-- name: conveyor_completion
-- conveyor keeps every task and logs every execution (schema "bench", see
-- conveyor_peer.py; attempt_log reads a succeeded attempt from its task
-- row); the window is the attempts' own clock.
select
    (select count(*) from bench.tasks where state = 'succeeded'),
    (select count(*) from bench.tasks where state <> 'succeeded'),
    (select min(started_at) from bench.attempt_log),
    (select max(finished_at) from bench.attempt_log)

-- name: pgqueuer_completion
-- PgQueuer deletes a finished job from pgqueuer and logs each status change
-- in pgqueuer_log ('picked' when claimed, 'successful' when done); rows left
-- in pgqueuer are unfinished.
select
    (select count(*) from pgqueuer_log where status = 'successful'),
    (select count(*) from pgqueuer),
    (select min(created) from pgqueuer_log where status = 'picked'),
    (select max(created) from pgqueuer_log where status = 'successful')

-- name: procrastinate_completion
-- Procrastinate keeps jobs (no delete_jobs) and logs 'started' and
-- 'succeeded' events with their time.
select
    (select count(*) from procrastinate_jobs where status = 'succeeded'),
    (select count(*) from procrastinate_jobs where status <> 'succeeded'),
    (select min(at) from procrastinate_events where type = 'started'),
    (select max(at) from procrastinate_events where type = 'succeeded')

-- name: chancy_completion
-- Chancy keeps jobs (its pruner only removes old ones) with started_at and
-- completed_at stamped by the worker.
select
    count(*) filter (where state = 'succeeded'),
    count(*) filter (where state <> 'succeeded'),
    min(started_at),
    max(completed_at)
from chancy_jobs

-- name: ceiling_table
-- The pgbench ceiling's queue: the least a SKIP LOCKED queue can be, one
-- state column and a partial index on what is still queued.
create table jobs (
    id bigint generated always as identity primary key,
    state text not null default 'queued'
)

-- name: ceiling_index
-- The claim's index: the oldest queued rows first.
create index jobs_queued on jobs (id) where state = 'queued'

-- name: ceiling_fill
-- Enough queued rows that the run cannot drain the table.
insert into jobs (state) select 'queued' from generate_series(1, %(rows)s)

-- name: ceiling_left
select count(*) filter (where state = 'queued'), count(*) filter (where state = 'done') from jobs
