-- Idempotency keys (see the PostgreSQL migration of the same number): a
-- task's key is unique among the tasks of its name, a send's key per
-- recipient, kept apart from the message (which goes once consumed).

alter table conveyor_tasks add column idempotency_key text;

create unique index conveyor_tasks_idempotency on conveyor_tasks (name, idempotency_key)
    where idempotency_key is not null;

create table conveyor_message_keys (
    task_id     integer not null references conveyor_tasks (id) on delete cascade,
    key         text not null,
    message_id  integer not null,
    primary key (task_id, key)
) without rowid;
