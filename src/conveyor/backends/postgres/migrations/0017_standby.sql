-- Idle workers' offers of free slots, which an enqueue of one task fills
-- directly (a hand-off): the enqueue inserts the task already leased to the
-- worker, in its own commit, and tells that worker on a channel of its own.
-- The task then starts after one durable commit, not two (the enqueue's and
-- a claim's). One row per offering worker:
--
-- - nonce: drawn by the worker process; with its id, it names the channel
--   the process hears its hand-offs on, so a process that restarts under
--   the same worker id neither inherits its predecessor's offer nor hears
--   its notices.
-- - free: slots an enqueue may still fill; each hand-off takes one.
-- - queues, names: what the worker serves (a hand-off must be one of them).
-- - lease_seconds: the lease of a handed-off task that sets none.
-- - until: the offer lapses then, unless its worker renews it; a worker
--   that dies offering is handed no more tasks after that.
--
-- Rows are few (one per idle worker) and small; a worker deletes its own
-- when it withdraws the offer.

create table {schema}.standby (
    worker_id     text primary key,
    nonce         text not null,
    queues        text[] not null,
    names         text[] not null,
    free          integer not null check (free >= 0),
    lease_seconds double precision not null,
    until         timestamptz not null
);
