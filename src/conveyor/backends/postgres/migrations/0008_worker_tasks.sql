-- What each worker serves, so that an operator (and an enqueue from the
-- command line) can tell whether any live worker runs a task's name on its
-- queue: the task names of the worker's app, and the longest pause between
-- two of its heartbeats (a worker silent for several of those is gone).

alter table {schema}.workers
    add column tasks text[] not null default array[]::text[],
    add column beat_seconds double precision;
