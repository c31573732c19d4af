-- Paused queues and task names (see the PostgreSQL migration of the same
-- purpose): no claim starts an attempt of a task whose queue or name is
-- listed here; running attempts go on.

create table conveyor_pauses (
    kind       text not null check (kind in ('queue', 'task')),
    name       text not null,
    paused_at  real not null,
    primary key (kind, name)
) without rowid;
