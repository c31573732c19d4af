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
-- Why a trigger: a task reaches a terminal state in many statements (a
-- finish, a claim's end of an expired lease, a quarantine, a cancel, a bulk
-- cancel, a cancelled coroutine's children, a dependent ended by its
-- policy). A trigger settles the edges in the same transaction whatever the
-- statement, as the triggers of migration 0003 tell parents. The time it
-- uses is the ended task's finished_at, which every statement sets to the
-- transaction's clock (:now). An enqueue counts the dependencies that had
-- ended already itself, at its own clock.
--
-- A dependent ended by its policy ends its own dependents in turn. The
-- trigger finds all of them at once (a recursive query over the edges not
-- settled yet) and settles their edges before it ends them, so the
-- trigger fired again by each of those ends finds nothing left to do: a
-- long chain of ends takes no deeper trigger recursion than a short one.
-- conveyor_ending holds that set while the trigger runs, keyed by the task
-- whose end started it (a table of the main schema: a trigger cannot use a
-- temporary one); it is empty between statements.
--
-- The trigger cannot wake idle workers: the backend wakes every worker of
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

create table conveyor_ending (
    origin  integer not null,
    id      integer not null,
    primary key (origin, id)
) without rowid;

-- A task with dependents reached a terminal state, at T (its finished_at).
-- S is the task and, if it failed or was cancelled, every dependent that
-- this ends by its policy, and theirs in turn: those waiting (with
-- waiting_for > 0) under a policy other than `run`, found over edges not
-- settled yet. Then, in this order:
-- 1. a dependent outside S still waiting counts each of its edges from S
--    (a success, or any end under `run`): the last makes it pending, due
--    at the later of T and its own run_at; otherwise waiting_for drops;
-- 2. the edges from S are settled at T (each once: a manual retry of S
--    moves no dependent again);
-- 3. the rest of S ends: failed under `fail`, cancelled under `cancel`.
-- The state is written only where it changes (the state triggers fire on
-- any write of it).
create trigger conveyor_dependency_ended
after update of state on conveyor_tasks
when new.awaited
 and new.state in ('succeeded', 'failed', 'cancelled')
 and old.state not in ('succeeded', 'failed', 'cancelled')
begin
    insert into conveyor_ending (origin, id)
    select new.id, id from (
        with recursive ending (id) as (
            select new.id
            union
            select w.id
            from ending
            join conveyor_dependencies e on e.task_id = ending.id and e.settled_at is null
            join conveyor_tasks w on w.id = e.dependent_id
            where new.state <> 'succeeded'
              and w.state = 'waiting' and w.waiting_for > 0 and w.after_policy <> 'run'
        )
        select id from ending);

    update conveyor_tasks
    set waiting_for = 0, state = 'pending',
        run_at = max(run_at, coalesce(new.finished_at, (julianday('now') - 2440587.5) * 86400.0))
    where id in (select e.dependent_id from conveyor_dependencies e
                 where e.settled_at is null
                   and e.task_id in (select id from conveyor_ending where origin = new.id))
      and state = 'waiting' and waiting_for > 0
      and (new.state = 'succeeded' or after_policy = 'run')
      and waiting_for = (
          select count(*) from conveyor_dependencies e
          where e.dependent_id = conveyor_tasks.id and e.settled_at is null
            and e.task_id in (select id from conveyor_ending where origin = new.id));

    update conveyor_tasks
    set waiting_for = waiting_for - (
        select count(*) from conveyor_dependencies e
        where e.dependent_id = conveyor_tasks.id and e.settled_at is null
          and e.task_id in (select id from conveyor_ending where origin = new.id))
    where id in (select e.dependent_id from conveyor_dependencies e
                 where e.settled_at is null
                   and e.task_id in (select id from conveyor_ending where origin = new.id))
      and state = 'waiting' and waiting_for > 0
      and (new.state = 'succeeded' or after_policy = 'run');

    update conveyor_dependencies
    set settled_at = coalesce(new.finished_at, (julianday('now') - 2440587.5) * 86400.0)
    where task_id in (select id from conveyor_ending where origin = new.id)
      and settled_at is null;

    update conveyor_tasks
    set state = case when after_policy = 'fail' then 'failed' else 'cancelled' end,
        finished_at = coalesce(new.finished_at, (julianday('now') - 2440587.5) * 86400.0)
    where id in (select id from conveyor_ending where origin = new.id and id <> new.id)
      and state = 'waiting';

    delete from conveyor_ending where origin = new.id;
end;

-- A cancelled coroutine cancels its live children as before (migration
-- 0003); a child that the cancel of a sibling ended first (as its
-- dependent) is left as that end left it: the children are chosen before
-- the first one changes.
drop trigger conveyor_parent_cancelled;
create trigger conveyor_parent_cancelled
after update of state on conveyor_tasks
when new.state = 'cancelled' and old.state <> 'cancelled' and new.inbox
begin
    update conveyor_tasks
    set state = case when state in ('pending', 'waiting') then 'cancelled' else state end,
        cancel_requested = case when state = 'in_progress' then 1 else cancel_requested end,
        finished_at = case when state in ('pending', 'waiting')
                           then (julianday('now') - 2440587.5) * 86400.0
                           else finished_at end
    where parent_id = new.id and state in ('pending', 'waiting', 'in_progress');
end;
