-- Periodic schedules, as workers sync them from their apps' code. A worker
-- fires a slot by moving last_slot forward (only forward) in the same
-- transaction that enqueues the slot's task: one task per schedule and slot,
-- however many workers compute the slot. A row names its definition (cron
-- or every, tz, missed-slot policy, args) so that any reader can compute
-- its next slot, and a fingerprint of it: a worker whose code defines the
-- schedule otherwise fires nothing.

create table {schema}.schedules (
    name           text primary key,
    task           text not null,
    cron           text,
    every_seconds  double precision,
    tz             text not null,
    missed         text not null,
    catch_up       integer not null,
    args           jsonb not null,
    fingerprint    text not null,
    last_slot      timestamptz,
    last_task_id   bigint,
    synced_at      timestamptz not null default statement_timestamp()
);
