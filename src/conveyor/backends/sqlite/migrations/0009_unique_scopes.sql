-- Unique tasks (see the PostgreSQL migration of the same purpose): a task
-- with a unique_scope gives its key up when it leaves that scope ('pending':
-- no longer pending; 'active': finished); one with unique_until holds it
-- until then. The trigger clears the key in the transaction that moves the
-- task (it fires on updates of state only, so its own update does not
-- fire it again).

alter table conveyor_tasks add column unique_scope text;
alter table conveyor_tasks add column unique_until real;

create trigger conveyor_tasks_unique_scope_left
after update of state on conveyor_tasks
when new.unique_scope is not null and new.idempotency_key is not null
     and (new.state in ('succeeded', 'failed', 'cancelled')
          or (new.unique_scope = 'pending' and new.state <> 'pending'))
begin
    update conveyor_tasks set idempotency_key = null where id = new.id;
end;
