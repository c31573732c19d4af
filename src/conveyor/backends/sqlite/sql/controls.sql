-- Operators' controls of tasks: cancel, retry, run now, delete, and their
-- bulk forms over a selection.
--
-- Named blocks of the SQLite backend; what their placeholders stand for is
-- said once, in conveyor.backends.sqlite.statements.

-- name: cancel
-- Cancel a task: pending and waiting ones at once; a running one is flagged
-- and its worker stops it once it hears of it (a cancel hint, or its next
-- heartbeat). Returns the state after.
update conveyor_tasks
set state = case when state = 'in_progress' then state else 'cancelled' end,
    cancel_requested = (state = 'in_progress'),
    finished_at = case when state = 'in_progress' then null else :now end
where id = :id and state in ('pending', 'waiting', 'in_progress')
returning state;

-- name: cancel_requested
-- Which of these leases (a JSON array of [id, attempt]), held by
-- :worker_id, have a cancel requested.
select t.id, t.attempt
from conveyor_tasks t
join (select json_extract(value, '$[0]') as id, json_extract(value, '$[1]') as attempt
      from json_each(:leases)) as l on l.id = t.id and l.attempt = t.attempt
where t.worker_id = :worker_id and t.cancel_requested;

-- name: retry
-- Run a failed or cancelled task again now, with a fresh attempt budget.
update conveyor_tasks
set state = 'pending', spent = 0, run_at = :now, cancel_requested = 0, result = null,
    finished_at = null
where id = :id and state in ('failed', 'cancelled')
returning state;

-- name: run_now
-- A pending task becomes due now (see the PostgreSQL statement).
update conveyor_tasks set run_at = min(run_at, :now)
where id = :id and state = 'pending'
returning state, queue;

-- name: delete_task
-- Delete a task that is not in progress (see the PostgreSQL statement) and
-- that no unfinished dependent waits for.
delete from conveyor_tasks
where id = :id and state <> 'in_progress'
  and (state in ('succeeded', 'failed', 'cancelled')
       or not exists (select 1 from conveyor_tasks p
                      where p.id = conveyor_tasks.parent_id
                        and p.state in ('pending', 'in_progress', 'waiting')))
  and not (awaited and {part_awaited})
returning id;

-- name: part_awaited
-- Whether an unfinished task depends on conveyor_tasks' row (and may yet
-- read its outcome): such a task is neither deleted nor pruned.
exists (select 1 from conveyor_dependencies e
             join conveyor_tasks w on w.id = e.dependent_id
             where e.task_id = conveyor_tasks.id
               and w.state in ('pending', 'in_progress', 'waiting'))

-- name: delete_blocker
-- Why delete_task deleted nothing: the task's state, its parent's, and
-- whether an unfinished dependent waits for it.
select conveyor_tasks.state, p.state, conveyor_tasks.awaited and {part_awaited}
from conveyor_tasks left join conveyor_tasks p on p.id = conveyor_tasks.parent_id
where conveyor_tasks.id = :id;

-- name: part_selected
-- The tasks a bulk action selects (see the PostgreSQL part_selected;
-- :states and :ids are JSON arrays, :ids null for any). Each bulk action
-- selects in its own statement, under the one writer: a task changed since
-- a caller listed it is judged as it is now.
state in (select value from json_each(:states)) and id > :after
      and (:ids is null or id in (select value from json_each(:ids)))
      and (:name is null or name = :name)
      and (:queue is null or queue = :queue)
      and (:since is null or created_at >= :since)
      and (:until is null or created_at < :until)

-- name: retry_many
-- One batch of a bulk retry (see the PostgreSQL statement), of the tasks
-- part_selected selects.
update conveyor_tasks
set state = 'pending', spent = 0, run_at = :now, cancel_requested = 0, result = null,
    finished_at = null
where id in (
    select id from conveyor_tasks
    where {part_selected}
    order by id
    limit :limit
)
returning id;

-- name: cancel_many
-- One batch of a bulk cancel, each task as cancel (see the PostgreSQL
-- statement); the triggers end children and tell parents as for one. A
-- selected task that the cancel of another one ended first (a child, a
-- dependent) is left as that end left it: the selection is made before the
-- first row changes.
update conveyor_tasks
set state = case when state in ('pending', 'waiting') then 'cancelled' else state end,
    cancel_requested = case when state = 'in_progress' then 1 else cancel_requested end,
    finished_at = case when state in ('pending', 'waiting') then :now else finished_at end
where id in (
    select id from conveyor_tasks
    where {part_selected}
    order by id
    limit :limit
)
returning id, state;

-- name: delete_many
-- One batch of a bulk delete of finished tasks (see the PostgreSQL
-- statement); attempts and messages go with them as for delete_task. A
-- task an unfinished dependent waits for is passed by.
delete from conveyor_tasks
where id in (
    select id from conveyor_tasks
    where {part_selected}
    order by id
    limit :limit
)
  and state in ('succeeded', 'failed', 'cancelled')
  and not (awaited and {part_awaited})
returning id;
