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
-- trigger conveyor_dependency_ended looks only at these). Returns each
-- one's state, to count at once those that have ended already.
update conveyor_tasks set awaited = 1
where id in (select value from json_each(:ids))
returning id, state;

-- name: settle_ended
-- The edges of a task just stored to the dependencies (a JSON array) that
-- had ended already: counted now, by the enqueue.
update conveyor_dependencies set settled_at = :now
where dependent_id = :dependent_id and task_id in (select value from json_each(:ids));

-- name: count_ended
-- A task just stored still waits, for fewer dependencies.
update conveyor_tasks set waiting_for = :waiting_for where id = :id;

-- name: end_waiting
-- A task just stored is moved by dependencies that had ended already: made
-- pending (due at the later of now and its own run_at), or ended failed or
-- cancelled by its policy (which the trigger conveyor_dependency_ended
-- passes on to its dependents).
update conveyor_tasks
set state = :state, waiting_for = :waiting_for,
    run_at = case when :state = 'pending' then max(run_at, :now) else run_at end,
    finished_at = case when :state = 'pending' then null else :now end
where id = :id;
