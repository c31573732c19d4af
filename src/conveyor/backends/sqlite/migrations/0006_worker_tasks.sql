-- What each worker serves, so that an operator (and an enqueue from the
-- command line) can tell whether any live worker runs a task's name on its
-- queue: the task names of the worker's app (a JSON array), and the longest
-- pause between two of its heartbeats (a worker silent for several of
-- those is gone).

alter table conveyor_workers add column tasks text not null default '[]';
alter table conveyor_workers add column beat_seconds real;
