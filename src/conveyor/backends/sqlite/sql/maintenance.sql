-- Upkeep: pruning finished tasks and stopped workers, and what a prune
-- would delete.
--
-- Named blocks of the SQLite backend; what their placeholders stand for is
-- said once, in conveyor.backends.sqlite.statements.

-- name: prune_tasks
-- Delete up to :limit finished tasks of state :state, finished before
-- :before, oldest ids first, whose parent is not alive (see the PostgreSQL
-- prune) and that no unfinished dependent waits for (part_awaited_by);
-- attempts, messages, keys and its own edges go with them (on delete cascade). The
-- state index (state, id) serves the order. Only tasks made before :before
-- can have finished before it: `search` halves the id range down to the first
-- id made at or after it (one probe of the primary key a step), and the walk
-- stops there, so that a state with nothing to prune does not read every
-- task of the state while the database's one writer waits.
delete from conveyor_tasks where id in (
    with recursive search (lo, hi) as (
        select coalesce((select min(id) from conveyor_tasks), 0),
               coalesce((select max(id) from conveyor_tasks) + 1, 0)
        union all
        select case when f.created_at < :before then min(f.id + 1, s.hi) else s.lo end,
               case when f.created_at < :before then s.hi else s.lo + (s.hi - s.lo) / 2 end
        from search s
        left join conveyor_tasks f on f.id = (
            select min(n.id) from conveyor_tasks n where n.id >= s.lo + (s.hi - s.lo) / 2)
        where s.lo < s.hi
    )
    select t.id from conveyor_tasks t
    where t.state = :state
      and t.id < (select min(hi) from search)
      and t.finished_at < :before
      and not exists (
          select 1 from conveyor_tasks p
          where p.id = t.parent_id and p.state in ('pending', 'in_progress', 'waiting'))
      and not (t.awaited and {part_awaited_by})
    order by t.id
    limit :limit
)
returning id;

-- name: prune_workers
delete from conveyor_workers where coalesce(stopped_at, last_seen_at) < :workers_before
returning id;

-- name: count_prunable
select count(*) from conveyor_tasks t
where t.state = :state
  and t.finished_at < :before
  and not exists (
      select 1 from conveyor_tasks p
      where p.id = t.parent_id and p.state in ('pending', 'in_progress', 'waiting'))
  and not (t.awaited and {part_awaited_by});

-- name: count_prunable_workers
select count(*) from conveyor_workers where coalesce(stopped_at, last_seen_at) < :workers_before;

-- name: part_awaited_by
-- Whether an unfinished task depends on the row `t` (and may yet read its
-- outcome): prune keeps such a task.
exists (select 1 from conveyor_dependencies e
             join conveyor_tasks w on w.id = e.dependent_id
             where e.task_id = t.id and w.state in ('pending', 'in_progress', 'waiting'))
