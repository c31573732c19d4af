-- The worker registry: register, stop, list.
--
-- Named blocks of the PostgreSQL backend; what their placeholders stand for is
-- said once, in conveyor.backends.postgres.statements.

-- name: register_worker
insert into {schema}.workers (id, host, pid, queues, concurrency, tasks, beat_seconds)
values (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s, %(tasks)s, %(beat_seconds)s)
on conflict (id) do update
set last_seen_at = statement_timestamp(), stopped_at = null,
    queues = excluded.queues, tasks = excluded.tasks, beat_seconds = excluded.beat_seconds;

-- name: stop_worker
update {schema}.workers
set stopped_at = statement_timestamp(), last_seen_at = statement_timestamp()
where id = %(id)s;

-- name: list_workers
select id, host, pid, queues, concurrency, started_at, last_seen_at, stopped_at,
       tasks, beat_seconds
from {schema}.workers
order by started_at desc;
