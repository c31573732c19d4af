-- Paused queues and task names: no claim starts an attempt of a task whose
-- queue or name is listed here (running attempts go on). A row per pause,
-- so the state survives restarts; resuming deletes it.

create table {schema}.pauses (
    kind       text not null check (kind in ('queue', 'task')),
    name       text not null,
    paused_at  timestamptz not null default statement_timestamp(),
    primary key (kind, name)
);
