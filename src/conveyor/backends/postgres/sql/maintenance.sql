-- Upkeep: pruning finished tasks and stopped workers, what a prune would
-- delete, and the tables the server will not vacuum.
--
-- Named blocks of the PostgreSQL backend; what their placeholders stand for is
-- said once, in conveyor.backends.postgres.statements.

-- name: prune
-- Delete up to %(limit)s::int finished tasks of the states whose cutoffs
-- are given, state by state in the order given (as every backend takes
-- them), oldest ids first within each: finished before it, no parent still alive
-- (its end message may yet be read), and no unfinished task depending on it
-- (its outcome may yet be read: part_awaited). Their attempts (attempts_gone), messages
-- and keys (foreign keys, on delete cascade) go with them; a child left behind keeps
-- running with no parent. One pruner at a time: a transaction-scoped
-- advisory lock, tried, not waited for; `held` false means another worker
-- is pruning and nothing was done.
--
-- A task finishes after it is made, so only tasks made before a cutoff can
-- have finished before it. `search` finds, for each cutoff, the first id
-- made at or after it, by halving the id range (each step one probe of the
-- primary key: about 30 for a billion ids), so that no batch walks the tasks
-- made after the cutoff. Ids follow creation order only roughly (concurrent
-- enqueues draw theirs in any order): a task on the wrong side of the bound
-- is pruned by a later prune, never before its cutoff.
--
-- Each state's tasks below its bound are then read off the listing index
-- (tasks_state_id: state, then id), oldest first, skipping rows locked by
-- anyone; `t.state <> 'in_progress'` lets the planner use that partial index
-- for a state it learns only at run time. The walk reads no task of another
-- state (failed tasks kept two weeks lie below the cutoff of succeeded ones
-- kept a day) and stops at the limit: a full batch reads about as many rows
-- as it deletes, and one that finds nothing to delete reads only the tasks
-- of its state made before the cutoff that are kept (those a live parent
-- keeps, those that finished after it). The walk's limit is a subquery:
-- the planner, not knowing how far below the bound the limit stops the walk,
-- takes it as a tenth of the rows (as under a generic plan); knowing the
-- limit and guessing a third of the table below the bound, it once read all
-- of them and sorted. Without statistics (autovacuum off means no ANALYZE
-- either) a plan that read every finished task and sorted them, each batch,
-- fell behind a drain; plan tests guard against both.
-- A parent is looked at through a scalar subquery, which PostgreSQL runs as
-- one probe of the primary key per candidate: written as `not exists`, it
-- could become a join, and statistics that knew no live task (taken before
-- a backlog came) made it a scan of every live task, read again for each
-- candidate. count_prunable looks at parents the same way.
with recursive guard as (
    select pg_try_advisory_xact_lock({lock_space}, -1) as held
),
search (state, before, ord, lo, hi) as (
    select c.state, c.before, c.ord, coalesce(e.lo, 0), coalesce(e.hi, 0)
    from unnest(%(states)s::text[], %(befores)s::timestamptz[])
             with ordinality as c(state, before, ord),
         (select min(id) as lo, max(id) + 1 as hi from {schema}.tasks) as e
    union all
    select s.state, s.before, s.ord,
           case when m.created_at < s.before then least(m.id + 1, s.hi) else s.lo end,
           case when m.created_at < s.before then s.hi else s.lo + (s.hi - s.lo) / 2 end
    from search s
    cross join lateral (
        select n.id, n.created_at from {schema}.tasks n
        where n.id >= s.lo + (s.hi - s.lo) / 2
        order by n.id
        limit 1
    ) as m
    where s.lo < s.hi
),
bounds as (
    select state, before, ord, min(hi) as bound from search group by state, before, ord
),
doomed as materialized (
    select d.id
    from guard, bounds c
    cross join lateral (
        select t.id from {schema}.tasks t
        where t.state = c.state and t.state <> 'in_progress'
          and t.id < c.bound
          and t.finished_at < c.before
          and not coalesce((select p.state in ('pending', 'in_progress', 'waiting')
                            from {schema}.tasks p where p.id = t.parent_id), false)
          and not {part_awaited}
        order by t.id
        limit (select %(limit)s::int)
        for update of t skip locked
    ) as d
    where guard.held
    -- The states in the order given (the walks hand over at most
    -- %(limit)s::int rows each: a sort of those few).
    order by c.ord, d.id
    limit %(limit)s::int
),
gone as (
    delete from {schema}.tasks t using doomed d where t.id = d.id
    returning t.id
),
-- The attempt log has no foreign key to its task (migration 0004): its rows
-- go here, in the same statement.
attempts_gone as (
    delete from {schema}.attempts a using gone g where a.task_id = g.id
),
workers_gone as (
    delete from {schema}.workers w using guard
    where guard.held and %(workers_before)s::timestamptz is not null
      and coalesce(w.stopped_at, w.last_seen_at) < %(workers_before)s::timestamptz
    returning w.id
)
select (select held from guard), (select count(*) from gone), (select count(*) from workers_gone);

-- name: count_prunable
-- How many finished tasks of each state a prune with these cutoffs would
-- delete, all batches together (a full read of those states' rows).
select t.state, count(*)
from {schema}.tasks t
join unnest(%(states)s::text[], %(befores)s::timestamptz[]) as c(state, before)
  on t.state = c.state and t.finished_at < c.before
where not coalesce((select p.state in ('pending', 'in_progress', 'waiting')
                    from {schema}.tasks p where p.id = t.parent_id), false)
  and not {part_awaited}
group by t.state
order by t.state;

-- name: count_prunable_workers
-- How many workers a prune with this cutoff would delete.
select count(*) from {schema}.workers
where coalesce(stopped_at, last_seen_at) < %(workers_before)s::timestamptz;

-- name: tables_to_vacuum
-- This schema's tables whose dead rows the server will not vacuum away: its
-- autovacuum is off (for the server, or the table), and they hold more dead
-- rows than 10,000 plus a twentieth of the live ones (autovacuum's default
-- is 50 plus a fifth: a queue's churn makes a larger base more sensible, and
-- a claim steps over the pending index's dead entries until a vacuum, so
-- history must not put the vacuum off; migration 0016 sets a twentieth for
-- autovacuum on `tasks` too).
select s.relname
from pg_stat_user_tables s
join pg_class c on c.oid = s.relid
where s.schemaname = %(schema)s::text
  and s.n_dead_tup > 10000 + 0.05 * s.n_live_tup
  and (current_setting('autovacuum') = 'off'
       or 'autovacuum_enabled=false' = any(coalesce(c.reloptions, array[]::text[])))
order by s.n_dead_tup desc;
