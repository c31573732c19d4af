-- The store's record of applied migrations (the migrations themselves are
-- the numbered files of migrations/).
--
-- Named blocks of the PostgreSQL backend; what their placeholders stand for is
-- said once, in conveyor.backends.postgres.statements.

-- name: applied_migrations
-- What opening a store reads first, in one round trip and without DDL: a
-- missing schema or table raises (undefined_table), which says the store
-- is not there; only a version missing here makes anyone run DDL.
select version from {schema}.migrations order by version;

-- name: record_migration
-- The record of a migration, as a reviewed script (migrate --sql) writes it.
insert into {schema}.migrations (version, name) values (%(version)s, %(name)s);
