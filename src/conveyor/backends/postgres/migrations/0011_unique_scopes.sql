-- Unique tasks: the idempotency key becomes a unique key with a scope. A
-- task with a unique_scope gives its key up when it leaves that scope
-- ('pending': once it is no longer pending; 'active': once it finishes): a
-- trigger clears the key in the same update that moves the task, so the
-- unique index lets the next enqueue of the key through from that commit
-- on. A task with unique_until holds its key until then (an enqueue that
-- wants the key clears it once the time has passed). Neither: the key is
-- held as long as the task is stored (an idempotency key).

alter table {schema}.tasks
    add column unique_scope text check (unique_scope in ('pending', 'active')),
    add column unique_until timestamptz;

create function {schema}.unique_scope_left() returns trigger
language plpgsql as $$
begin
    new.idempotency_key := null;
    return new;
end
$$;

create trigger tasks_unique_scope_left
    before update of state on {schema}.tasks
    for each row
    when (new.unique_scope is not null and new.idempotency_key is not null
          and (new.state in ('succeeded', 'failed', 'cancelled')
               or (new.unique_scope = 'pending' and new.state <> 'pending')))
    execute function {schema}.unique_scope_left();
