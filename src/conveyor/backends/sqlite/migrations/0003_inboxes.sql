-- Coroutine tasks: inboxes, parents, and the end-of-stream a parent gets
-- (see the PostgreSQL migration of the same number). Triggers use SQLite's
-- clock; the connection enables recursive triggers, so a cancel reaches
-- grandchildren too.

alter table conveyor_tasks add column parent_id integer
    references conveyor_tasks (id) on delete set null;
alter table conveyor_tasks add column inbox integer not null default 0;

create index conveyor_tasks_parent on conveyor_tasks (parent_id) where parent_id is not null;

create table conveyor_messages (
    id          integer primary key autoincrement,
    task_id     integer not null references conveyor_tasks (id) on delete cascade,
    sender_id   integer,
    kind        text not null default 'message' check (kind in ('message', 'end')),
    body        text not null,
    created_at  real not null
);

create index conveyor_messages_inbox on conveyor_messages (task_id, id);

-- A child reached a terminal state: its live parent gets an `end` message
-- and is woken (waiting → pending; a sleeping one due now).
create trigger conveyor_child_ended
after update of state on conveyor_tasks
when new.parent_id is not null
 and new.state in ('succeeded', 'failed', 'cancelled')
 and old.state not in ('succeeded', 'failed', 'cancelled')
begin
    insert into conveyor_messages (task_id, sender_id, kind, body, created_at)
    select p.id, new.id, 'end',
           json_object('child', new.id, 'name', new.name, 'state', new.state,
                       'result', json(new.result)),
           (julianday('now') - 2440587.5) * 86400.0
    from conveyor_tasks p
    where p.id = new.parent_id and p.state in ('pending', 'in_progress', 'waiting');
    update conveyor_tasks
    set state = 'pending', run_at = min(run_at, (julianday('now') - 2440587.5) * 86400.0)
    where id = new.parent_id
      and (state = 'waiting'
           or (state = 'pending' and run_at > (julianday('now') - 2440587.5) * 86400.0));
end;

-- A cancelled coroutine cancels its live children: pending and waiting ones
-- at once, running ones are flagged (as by a cancel).
create trigger conveyor_parent_cancelled
after update of state on conveyor_tasks
when new.state = 'cancelled' and old.state <> 'cancelled' and new.inbox
begin
    update conveyor_tasks
    set state = case when state = 'in_progress' then state else 'cancelled' end,
        cancel_requested = (state = 'in_progress'),
        finished_at = case when state = 'in_progress' then null
                           else (julianday('now') - 2440587.5) * 86400.0 end
    where parent_id = new.id and state in ('pending', 'waiting', 'in_progress');
end;
