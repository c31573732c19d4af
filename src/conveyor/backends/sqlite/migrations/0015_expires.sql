-- A task's expiry time (the `expires` option; see the PostgreSQL migration
-- of the same purpose), in seconds since the epoch as every time here.

alter table conveyor_tasks add column expires_at real;
