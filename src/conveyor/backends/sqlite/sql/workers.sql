-- The worker registry: register, stop, list.
--
-- Named blocks of the SQLite backend; what their placeholders stand for is
-- said once, in conveyor.backends.sqlite.statements.

-- name: register_worker
insert into conveyor_workers
    (id, host, pid, queues, concurrency, started_at, last_seen_at, tasks, beat_seconds)
values (:id, :host, :pid, :queues, :concurrency, :now, :now, :tasks, :beat_seconds)
on conflict (id) do update set
    last_seen_at = :now, stopped_at = null,
    queues = :queues, tasks = :tasks, beat_seconds = :beat_seconds;

-- name: stop_worker
update conveyor_workers set stopped_at = :now, last_seen_at = :now where id = :id;

-- name: list_workers
select id, host, pid, queues, concurrency, started_at, last_seen_at, stopped_at,
       tasks, beat_seconds
from conveyor_workers
order by started_at desc;
