-- A task gives its unique key up when its state moves out of the key's
-- scope, not whenever a statement writes its state. `after update of state`
-- fires for every row whose SET list names the column, its value changed or
-- not, and settle_ended (migration 0022) writes `state` of every dependent
-- it counts an end of: one still waiting after the count (waiting to
-- waiting) lost a `pending`-scoped key it holds until a worker starts it,
-- as every other backend keeps it (a dependent is stored waiting, in the
-- scope of its `pending` key). The trigger now fires only on a move of
-- state; every move out of a scope is one, so nothing else changes.

drop trigger tasks_unique_scope_left on {schema}.tasks;

create trigger tasks_unique_scope_left
    after update of state on {schema}.tasks
    for each row
    when (new.unique_scope is not null and new.idempotency_key is not null
          and new.state is distinct from old.state
          and (new.state in ('succeeded', 'failed', 'cancelled')
               or (new.unique_scope = 'pending' and new.state <> 'pending')))
    execute function {schema}.unique_scope_left();
