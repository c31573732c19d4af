-- pgbench script of the ceiling run (benchmarks/peers.py): one transaction
-- claims the 100 oldest queued rows with FOR UPDATE SKIP LOCKED and marks
-- them done, the least work a queue's batched claim and finish can do.
-- MATERIALIZED keeps the CTE an optimisation fence, so the planner cannot
-- fold it into the update and lock more rows than the LIMIT asks.
with claimed as materialized (
    select id from jobs
    where state = 'queued'
    order by id
    limit 100
    for update skip locked
)
update jobs set state = 'done' from claimed where jobs.id = claimed.id;
