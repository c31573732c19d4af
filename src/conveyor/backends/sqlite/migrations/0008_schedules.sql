-- Periodic schedules (see the PostgreSQL migration of the same purpose).

create table conveyor_schedules (
    name           text primary key,
    task           text not null,
    cron           text,
    every_seconds  real,
    tz             text not null,
    missed         text not null,
    catch_up       integer not null,
    args           text not null,
    fingerprint    text not null,
    last_slot      real,
    last_task_id   integer,
    synced_at      real not null
) without rowid;
