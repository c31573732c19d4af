-- The wake-up turns of workers of one kind (advisory session locks).
--
-- Named blocks of the PostgreSQL backend; what their placeholders stand for is
-- said once, in conveyor.backends.postgres.statements.

-- name: turn_take
-- Takes the wake-up turn of one kind of worker (%(kind)s: a 32-bit key
-- drawn from its queues and task names) if no session holds it: true if
-- taken. A session lock, held until turn_give or the session's end; it never
-- waits, since the session connection is shared (see
-- conveyor.backends.postgres.session). The first key keeps these locks apart
-- from the schema's others.
select pg_try_advisory_lock(({lock_space} # 2), %(kind)s::int);

-- name: turn_give
-- Gives the turn back and tells the workers waiting for it.
select pg_advisory_unlock(({lock_space} # 2), %(kind)s::int),
       pg_notify({turn_channel}, %(kind)s::text);
