-- Coroutine tasks: inboxes, parents, and the end-of-stream a parent gets.
--
-- A coroutine task (inbox = true) keeps its state as its payload and reads
-- the messages of its inbox at each poll. A message stays until a poll that
-- saw it ends with an applied completion, which deletes it in the same
-- transaction. A task spawned by a coroutine has parent_id set; when it
-- reaches a terminal state, the trigger below sends its parent one `end`
-- message, whatever ended it (its worker, a spent crash budget, a cancel).

alter table {schema}.tasks add column parent_id bigint
    references {schema}.tasks (id) on delete set null;
alter table {schema}.tasks add column inbox boolean not null default false;

-- Children of a task, for cancelling them with their parent.
create index tasks_parent on {schema}.tasks (parent_id) where parent_id is not null;

create table {schema}.messages (
    id          bigint generated always as identity primary key,
    task_id     bigint not null references {schema}.tasks (id) on delete cascade,
    sender_id   bigint,
    kind        text not null default 'message' check (kind in ('message', 'end')),
    body        jsonb not null,
    created_at  timestamptz not null default statement_timestamp()
);

-- A poll reads its inbox oldest first.
create index messages_inbox on {schema}.messages (task_id, id);

-- A task reached a terminal state. Its parent, if live, gets an `end`
-- message and is woken (a waiting parent is pending again, a sleeping one
-- due now). A cancelled coroutine cancels its live children (pending and
-- waiting ones at once; running ones are flagged, as by a cancel), whose
-- own ends then reach it. The parent row is locked before it is read: a
-- parent whose poll is ending at this moment either sees this message or
-- is woken by it once that poll has committed.
create function {schema}.task_ended() returns trigger
language plpgsql as $$
declare
    parent_state text;
    woken_queue text;
begin
    if new.parent_id is not null then
        select state into parent_state from {schema}.tasks
        where id = new.parent_id for update;
        if parent_state in ('pending', 'in_progress', 'waiting') then
            insert into {schema}.messages (task_id, sender_id, kind, body)
            values (new.parent_id, new.id, 'end',
                    jsonb_build_object('child', new.id, 'name', new.name,
                                       'state', new.state, 'result', new.result));
            update {schema}.tasks
            set state = 'pending', run_at = least(run_at, statement_timestamp())
            where id = new.parent_id
              and (state = 'waiting' or (state = 'pending' and run_at > statement_timestamp()))
            returning queue into woken_queue;
            if woken_queue is not null then
                perform pg_notify('conveyor_' || tg_table_schema, woken_queue);
            end if;
        end if;
    end if;
    if new.state = 'cancelled' and new.inbox then
        update {schema}.tasks
        set state = case when state = 'in_progress' then state else 'cancelled' end,
            cancel_requested = (state = 'in_progress'),
            finished_at = case when state = 'in_progress' then null
                               else statement_timestamp() end
        where parent_id = new.id and state in ('pending', 'waiting', 'in_progress');
    end if;
    return null;
end
$$;

create trigger tasks_ended
    after update of state on {schema}.tasks
    for each row
    when (new.state in ('succeeded', 'failed', 'cancelled')
          and old.state not in ('succeeded', 'failed', 'cancelled')
          and (new.parent_id is not null or new.inbox))
    execute function {schema}.task_ended();
