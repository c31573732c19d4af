-- The wake-up turns of workers of one kind (advisory session locks).
--
-- Named blocks of the PostgreSQL backend; what their placeholders stand for is
-- said once, in conveyor.backends.postgres.statements.

-- name: turn_take
-- Waits for the wake-up turn of one kind of worker (%(kind)s: a 32-bit key
-- drawn from its queues and task names), a session lock held until
-- turn_give or the session's end; waiters are granted in turn (see
-- conveyor.backends.postgres.turns). The first key keeps these locks apart
-- from the schema's others.
select pg_advisory_lock(({lock_space} # 2), %(kind)s::int);

-- name: turn_give
select pg_advisory_unlock(({lock_space} # 2), %(kind)s::int);
