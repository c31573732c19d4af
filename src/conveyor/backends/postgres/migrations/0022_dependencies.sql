-- Task dependencies (`after`): a task stored waiting for others, and the
-- one place that settles them: the trigger below, in the transaction of
-- whatever write ends a task (a completion, a cancel, a bulk cancel, a
-- reclaim whose crash budget is spent, a quarantine, a coroutine's cancel of
-- its children). No polling task, no scan of a dependent's other edges: an
-- end costs one step per edge to the task that ended.
--
-- waiting_for: how many of a dependent's edges are not settled yet as its
-- policy counts them (null: the task has no dependencies). after_policy:
-- what a dependency that failed or was cancelled does to it. receives: what
-- the worker hands it of its dependencies' outcomes (conveyor.dependencies).
-- dependents: some task depends on this one, so that the end of a task
-- nothing depends on fires no trigger. Adding columns with constant
-- defaults rewrites nothing (PostgreSQL 11+).

alter table {schema}.tasks
    add column waiting_for integer,
    add column after_policy text check (after_policy in ('cancel', 'fail', 'run')),
    add column receives text,
    add column dependents boolean not null default false;

-- One edge per entry of a dependent's `after`, by position. depends_on has
-- no foreign key: a deleted dependency's edge stays, and reads as a task no
-- longer stored. settled: the dependency's end was counted (once: a manual
-- retry of it moves no dependent again).
create table {schema}.dependencies (
    task_id     bigint not null references {schema}.tasks (id) on delete cascade,
    position    integer not null,
    depends_on  bigint not null,
    settled     boolean not null default false,
    primary key (task_id, position)
);

-- An end finds the edges to its task; a delete or a prune finds whether an
-- unfinished task depends on it.
create index dependencies_depends_on on {schema}.dependencies (depends_on);

-- Settle the edges to tasks that just ended (ids, their terminal states and
-- end times), and the edges to those this ends, and so on: a worklist, not
-- a recursion of triggers, so that a chain of any length ends in one write.
-- Each dependent still waiting counts the ends: a success, or any end under
-- `run`, takes one off waiting_for, the last making it pending (due at the
-- later of the end and its own run_at, its queue's idle workers notified);
-- a failure or a cancel ends it cancelled (`cancel`) or failed (`fail`). The
-- dependents it ends in turn are not settled by their own trigger (the
-- setting conveyor.settling is on meanwhile: see the trigger's WHEN) but by
-- the next round of this loop. A released dependent's time is the end's
-- (finished_at), so that a test's injected clock rules it too. `channel`:
-- the schema's wake-up channel.
--
-- Race with an enqueue: an enqueue that names a dependency locks its row
-- (it sets `dependents`) before it reads its state and stores its edges. If
-- the ending write locked the row first, the enqueue waits for its commit,
-- then finds the dependency ended and counts it itself; if the enqueue
-- locked it first, the ending update waits for the enqueue's commit, and
-- this function's statements (each with a snapshot of its own, as in any
-- plpgsql function in READ COMMITTED) then see the committed edges. Either
-- way one of them counts the end, never both.
create function {schema}.settle_ended(
    ended bigint[], states text[], ats timestamptz[], channel text
) returns void
language plpgsql as $$
begin
    perform set_config('conveyor.settling', 'on', true);
    while coalesce(cardinality(ended), 0) > 0 loop
        with ending as (
            select * from unnest(ended, states, ats) as x(id, state, at)
        ),
        edges as (
            update {schema}.dependencies e set settled = true
            from ending x
            where e.depends_on = x.id and not e.settled
            returning e.task_id, x.state, x.at
        ),
        counted as (
            select task_id,
                   count(*) filter (where state = 'succeeded')::int as ok,
                   count(*) filter (where state <> 'succeeded')::int as bad,
                   max(at) as at
            from edges group by task_id
        ),
        -- The dependents, locked in id order first: two transactions that
        -- count ends in the same dependents (each ending members of two
        -- chords) wait for each other instead of deadlocking.
        locked as materialized (
            select d.id from {schema}.tasks d
            where d.id in (select task_id from counted)
            order by d.id
            for no key update of d
        ),
        -- Each dependent's row as it is when this update locks it: two ends
        -- counted at once by two transactions wait for each other's row lock,
        -- and the second counts from the first's result (a value read before
        -- the lock, from this statement's snapshot, would lose one of them).
        moved as (
            update {schema}.tasks d
            set waiting_for = case when d.after_policy <> 'run' and c.bad > 0 then d.waiting_for
                                   else greatest(d.waiting_for - c.ok - c.bad, 0) end,
                state = case when d.after_policy <> 'run' and c.bad > 0
                             then case when d.after_policy = 'fail' then 'failed'
                                       else 'cancelled' end
                             when d.waiting_for - c.ok - c.bad <= 0 then 'pending'
                             else 'waiting' end,
                run_at = case when (d.after_policy = 'run' or c.bad = 0)
                                   and d.waiting_for - c.ok - c.bad <= 0
                              then greatest(d.run_at, c.at) else d.run_at end,
                finished_at = case when d.after_policy <> 'run' and c.bad > 0 then c.at
                                   else d.finished_at end
            from counted c
            where d.id = c.task_id and d.state = 'waiting' and d.waiting_for > 0
              and d.id in (select id from locked)
            returning d.id, d.queue, d.state, d.finished_at, d.dependents
        ),
        notified as (
            select count(pg_notify(channel, q.queue)) as n
            from (select distinct queue from moved where state = 'pending') as q
        )
        select coalesce(array_agg(m.id) filter (where m.dependents and m.state <> 'pending'
                                                  and m.state <> 'waiting'), array[]::bigint[]),
               coalesce(array_agg(m.state) filter (where m.dependents and m.state <> 'pending'
                                                     and m.state <> 'waiting'), array[]::text[]),
               coalesce(array_agg(m.finished_at) filter (where m.dependents
                                                           and m.state <> 'pending'
                                                           and m.state <> 'waiting'),
                        array[]::timestamptz[])
        into ended, states, ats
        from (select 1) as one
        left join moved m on true
        cross join notified;
    end loop;
    perform set_config('conveyor.settling', '', true);
end
$$;

create function {schema}.settle_dependents() returns trigger
language plpgsql as $$
begin
    perform {schema}.settle_ended(
        array[new.id], array[new.state],
        array[coalesce(new.finished_at, statement_timestamp())],
        'conveyor_' || tg_table_schema);
    return null;
end
$$;

create trigger tasks_settle_dependents
    after update of state on {schema}.tasks
    for each row
    when (new.dependents
          and new.state in ('succeeded', 'failed', 'cancelled')
          and old.state not in ('succeeded', 'failed', 'cancelled')
          and coalesce(current_setting('conveyor.settling', true), '') <> 'on')
    execute function {schema}.settle_dependents();
