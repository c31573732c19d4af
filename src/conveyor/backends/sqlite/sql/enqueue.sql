-- Inserting tasks, plain and with idempotency keys, and the edges of those
-- with dependencies.
--
-- Named blocks of the SQLite backend; what their placeholders stand for is
-- said once, in conveyor.backends.sqlite.statements.

-- name: enqueue
-- One task; run many times in one transaction (executemany).
insert into conveyor_tasks
    (name, queue, payload, priority, run_at, max_attempts, retry_policy,
     timeout_seconds, lease_seconds, created_at, step, inbox, parent_id, idempotency_key,
     concurrency_key, concurrency_limit, rate_limit, rate_period, trace_context, expires_at,
     state, waiting_for, after_policy, receives)
values (:name, :queue, :payload, :priority, coalesce(:run_at, :now + :delay), :max_attempts,
        :retry_policy, :timeout, :lease, :now, :step, :inbox, :parent_id, :idempotency_key,
        :concurrency_key, :concurrency_limit, :rate_limit, :rate_period, :trace, :expires_at,
        :state, :waiting_for, :after_policy, :receives);

-- name: enqueue_keyed
-- One task that may carry an idempotency key: skipped when its name and key
-- are stored already (then stored_key reads the stored task's id).
insert into conveyor_tasks
    (name, queue, payload, priority, run_at, max_attempts, retry_policy,
     timeout_seconds, lease_seconds, created_at, step, inbox, parent_id, idempotency_key,
     unique_scope, unique_until, concurrency_key, concurrency_limit, rate_limit, rate_period,
     trace_context, expires_at, state, waiting_for, after_policy, receives)
values (:name, :queue, :payload, :priority, coalesce(:run_at, :now + :delay), :max_attempts,
        :retry_policy, :timeout, :lease, :now, :step, :inbox, :parent_id, :idempotency_key,
        :unique_scope, :now + :unique_for, :concurrency_key, :concurrency_limit, :rate_limit,
        :rate_period, :trace, :expires_at, :state, :waiting_for, :after_policy, :receives)
on conflict (name, idempotency_key) where idempotency_key is not null do nothing
returning id;

-- name: unknown_dependencies
-- Which of the stored ids a batch's dependencies name (a JSON array) are
-- not stored: the enqueue then stores nothing.
select value from json_each(:ids)
where value not in (select id from conveyor_tasks where id in (select value from json_each(:ids)));

-- name: add_dependency
-- One edge of a task just stored waiting, at its position in `after`.
insert into conveyor_dependencies (dependent_id, position, task_id)
values (:dependent_id, :position, :task_id);

-- name: mark_awaited
-- The tasks a dependent names: their ends settle edges from now on (the
-- trigger conveyor_dependency_ended looks only at these). Returns those
-- that have ended already, to be counted at once.
update conveyor_tasks set awaited = 1
where id in (select value from json_each(:ids))
returning id, state in ('succeeded', 'failed', 'cancelled');

-- name: settle_ended
-- A dependency of a task just stored had ended already: its edges to it
-- are settled now, and the trigger conveyor_dependency_settled counts them.
update conveyor_dependencies set settled_at = :now
where dependent_id = :dependent_id and task_id = :task_id and settled_at is null;
