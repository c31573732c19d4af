-- Inserting tasks, plain and with idempotency keys.
--
-- Named blocks of the SQLite backend; what their placeholders stand for is
-- said once, in conveyor.backends.sqlite.statements.

-- name: enqueue
-- One task; run many times in one transaction (executemany).
insert into conveyor_tasks
    (name, queue, payload, priority, run_at, max_attempts, retry_policy,
     timeout_seconds, lease_seconds, created_at, step, inbox, parent_id, idempotency_key,
     concurrency_key, concurrency_limit, rate_limit, rate_period, trace_context, expires_at)
values (:name, :queue, :payload, :priority, coalesce(:run_at, :now + :delay), :max_attempts,
        :retry_policy, :timeout, :lease, :now, :step, :inbox, :parent_id, :idempotency_key,
        :concurrency_key, :concurrency_limit, :rate_limit, :rate_period, :trace, :expires_at);

-- name: enqueue_keyed
-- One task that may carry an idempotency key: skipped when its name and key
-- are stored already (then stored_key reads the stored task's id).
insert into conveyor_tasks
    (name, queue, payload, priority, run_at, max_attempts, retry_policy,
     timeout_seconds, lease_seconds, created_at, step, inbox, parent_id, idempotency_key,
     unique_scope, unique_until, concurrency_key, concurrency_limit, rate_limit, rate_period,
     trace_context, expires_at)
values (:name, :queue, :payload, :priority, coalesce(:run_at, :now + :delay), :max_attempts,
        :retry_policy, :timeout, :lease, :now, :step, :inbox, :parent_id, :idempotency_key,
        :unique_scope, :now + :unique_for, :concurrency_key, :concurrency_limit, :rate_limit,
        :rate_period, :trace, :expires_at)
on conflict (name, idempotency_key) where idempotency_key is not null do nothing
returning id;
