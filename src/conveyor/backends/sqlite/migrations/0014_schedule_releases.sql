-- Releases of schedules (see the PostgreSQL migration of the same purpose).
-- The generation is the rowid: SQLite gives a new row one more than the
-- greatest, and no row is ever deleted. tasks is a JSON array.

create table conveyor_schedule_releases (
    generation  integer primary key,
    release     text not null unique,
    tasks       text not null,
    seen_at     real not null
);

alter table conveyor_schedules add column release text;
