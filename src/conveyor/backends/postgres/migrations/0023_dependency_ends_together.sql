-- Two dependencies of one dependent that end at the same moment, in two
-- transactions, both count. settle_ended (0022) took a dependent's
-- waiting_for from the statement's snapshot: the second end, having waited
-- for the first's lock on the dependent's row, wrote that stale count less
-- its own, and the first end's count was lost (a chord's callback whose
-- members ended together could wait forever). Its update now counts from
-- the row as the lock hands it over (PostgreSQL re-reads a row a
-- concurrent update changed, and checks it is still waiting, before it
-- writes it), so each end takes its own off whatever the other left.
-- Nothing else changes: the edges one end settles are its own (no two ends
-- settle one edge), and the snapshot still only picks which dependents to
-- look at.

create or replace function {schema}.settle_ended(
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
        judged as (
            select c.*, d.after_policy <> 'run' and c.bad > 0 as ends
            from counted c join {schema}.tasks d on d.id = c.task_id
            where d.state = 'waiting' and d.waiting_for > 0
        ),
        moved as (
            update {schema}.tasks d
            set waiting_for = case when j.ends then d.waiting_for
                                   else greatest(d.waiting_for - j.ok - j.bad, 0) end,
                state = case when j.ends and d.after_policy = 'fail' then 'failed'
                             when j.ends then 'cancelled'
                             when d.waiting_for - j.ok - j.bad <= 0 then 'pending'
                             else 'waiting' end,
                run_at = case when not j.ends and d.waiting_for - j.ok - j.bad <= 0
                              then greatest(d.run_at, j.at) else d.run_at end,
                finished_at = case when j.ends then j.at else d.finished_at end
            from judged j
            where d.id = j.task_id and d.state = 'waiting' and d.waiting_for > 0
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
