-- The store's record of applied migrations (the migrations themselves are
-- the numbered files of migrations/), and the tables dropped when a store
-- is destroyed.
--
-- Named blocks of the SQLite backend; what their placeholders stand for is
-- said once, in conveyor.backends.sqlite.statements.

-- name: migrations_table
create table if not exists conveyor_migrations (
    version     integer primary key,
    name        text not null,
    applied_at  real not null default ((julianday('now') - 2440587.5) * 86400.0)
);

-- name: migrations_table_exists
select 1 from sqlite_master where type = 'table' and name = 'conveyor_migrations';

-- name: latest_migration
select max(version) from conveyor_migrations;

-- name: migration_applied
select 1 from conveyor_migrations where version = :version;

-- name: record_migration
insert into conveyor_migrations (version, name) values (:version, :name);

-- name: record_migration_script
-- The record of a migration, as a reviewed script (migrate --sql) writes it:
-- the values are the migration's own number and file name.
insert into conveyor_migrations (version, name) values ({version}, '{name}');

-- name: applied_migrations
select version from conveyor_migrations order by version;

-- name: drop_messages
drop table if exists conveyor_messages;

-- name: drop_attempts
drop table if exists conveyor_attempts;

-- name: drop_workers
drop table if exists conveyor_workers;

-- name: drop_tasks
drop table if exists conveyor_tasks;

-- name: drop_migrations
drop table if exists conveyor_migrations;

-- name: drop_message_keys
drop table if exists conveyor_message_keys;

-- name: drop_dependencies
drop table if exists conveyor_dependencies;

-- name: drop_ending
drop table if exists conveyor_ending;
