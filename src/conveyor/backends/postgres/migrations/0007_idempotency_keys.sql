-- Idempotency keys: an enqueue or a send that can be repeated safely.
--
-- A caller whose connection dropped right after its commit was sent cannot
-- tell whether the task (or message) was stored. With a key, repeating the
-- call stores nothing more and returns what the first call stored.
--
-- A task's key is unique among the tasks of its name; the unique index does
-- the deciding, so concurrent enqueues of one key (from any number of
-- processes, in their own transactions too) store one task. A send's key is
-- unique per recipient and is kept in message_keys, apart from the message:
-- the message goes once a poll consumes it, the key stays with its task.

alter table {schema}.tasks add column idempotency_key text;

create unique index tasks_idempotency on {schema}.tasks (name, idempotency_key)
    where idempotency_key is not null;

create table {schema}.message_keys (
    task_id     bigint not null references {schema}.tasks (id) on delete cascade,
    key         text not null,
    -- Null only inside the send that claimed the key, until it commits.
    message_id  bigint,
    primary key (task_id, key)
);
