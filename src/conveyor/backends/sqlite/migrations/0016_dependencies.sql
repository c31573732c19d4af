-- Task dependencies (`after`): a task stored waiting for others, one edge
-- per entry of its `after`, in order. waiting_for counts the dependencies
-- whose end it still waits for (null: a task without dependencies);
-- after_policy says what a failed or cancelled one does to it; receives is
-- stored for its worker. awaited marks a task that some dependent names, so
-- that the end of every other task skips the edge lookup.
--
-- An edge's task_id has no foreign key: an edge outlives a deleted
-- dependency (the dependent then reads it as no longer stored); its
-- dependent's delete takes the dependent's edges with it. settled_at is the
-- time its dependency's end was counted (null: not yet); it is settled once,
-- so a manual retry of the dependency moves no dependent again.
--
-- Why triggers: a task reaches a terminal state in many statements (a
-- finish, a claim's end of an expired lease, a quarantine, a cancel, a bulk
-- cancel, a cancelled coroutine's children, a dependent ended by its
-- policy). Triggers settle the edges in the same transaction whatever the
-- statement, as the triggers of migration 0003 tell parents. The time they
-- use is the ended task's finished_at, which every statement sets to the
-- transaction's clock (:now); an enqueue settles the edges to dependencies
-- that had ended already itself, at its own clock.
--
-- A dependent ended by its policy ends its own dependents in turn: the
-- triggers fire again, which needs `pragma recursive_triggers` (the
-- backend's connections turn it on). Each link of such a chain of ends
-- takes two trigger levels, and SQLite allows 1000: a write whose chain of
-- ends by policy is longer than 499 tasks fails ("too many levels of
-- trigger recursion") and changes nothing. Releases (a dependent made
-- pending) do not chain: the dependent has to run first.
--
-- The triggers cannot wake idle workers: the backend wakes every worker of
-- its process after a write that ended a task with dependents, and workers
-- of other processes see the commit.

alter table conveyor_tasks add column waiting_for integer;
alter table conveyor_tasks add column after_policy text
    check (after_policy in ('cancel', 'fail', 'run'));
alter table conveyor_tasks add column receives text;
alter table conveyor_tasks add column awaited integer not null default 0;

create table conveyor_dependencies (
    dependent_id  integer not null references conveyor_tasks (id) on delete cascade,
    position      integer not null,
    task_id       integer not null,
    settled_at    real,
    primary key (dependent_id, position)
) without rowid;

-- An ended task's edges (to settle), and a task's dependents (before a
-- delete or a prune).
create index conveyor_dependencies_task on conveyor_dependencies (task_id);

-- A task with dependents reached a terminal state: settle its edges not
-- settled yet, at the time it ended.
create trigger conveyor_dependency_ended
after update of state on conveyor_tasks
when new.awaited
 and new.state in ('succeeded', 'failed', 'cancelled')
 and old.state not in ('succeeded', 'failed', 'cancelled')
begin
    update conveyor_dependencies
    set settled_at = coalesce(new.finished_at, (julianday('now') - 2440587.5) * 86400.0)
    where task_id = new.id and settled_at is null;
end;

-- An edge is settled: its dependent, if still waiting for it, counts its
-- dependency's end. A success, or any end under the `run` policy, takes
-- one off waiting_for and the last makes it pending, due at the later of
-- then and its own run_at; a failed or cancelled dependency ends it
-- cancelled (`cancel`) or failed (`fail`). Three statements, so that the
-- state is written only when it changes (the state triggers fire on any
-- write of it): the release first, then a count that leaves it waiting,
-- then an end.
create trigger conveyor_dependency_settled
after update of settled_at on conveyor_dependencies
when old.settled_at is null and new.settled_at is not null
begin
    update conveyor_tasks
    set waiting_for = 0, state = 'pending', run_at = max(run_at, new.settled_at)
    where id = new.dependent_id and state = 'waiting' and waiting_for = 1
      and (after_policy = 'run'
           or exists (select 1 from conveyor_tasks d
                      where d.id = new.task_id and d.state = 'succeeded'));
    update conveyor_tasks
    set waiting_for = waiting_for - 1
    where id = new.dependent_id and state = 'waiting' and waiting_for > 1
      and (after_policy = 'run'
           or exists (select 1 from conveyor_tasks d
                      where d.id = new.task_id and d.state = 'succeeded'));
    update conveyor_tasks
    set state = case when after_policy = 'fail' then 'failed' else 'cancelled' end,
        finished_at = new.settled_at
    where id = new.dependent_id and state = 'waiting' and waiting_for > 0
      and after_policy <> 'run'
      and not exists (select 1 from conveyor_tasks d
                      where d.id = new.task_id and d.state = 'succeeded');
end;
