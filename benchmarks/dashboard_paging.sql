-- The statements of benchmarks/dashboard_paging.py (not part of conveyor).

-- name: finish_all
-- Mark every enqueued task succeeded, as a worker's completions would have,
-- spreading their finish times over the last day; then refresh the
-- planner's statistics, as autovacuum would after such a change.
update {schema}.tasks
set state = 'succeeded', attempt = 1, spent = 1, result = '1'::jsonb,
    finished_at = now() - (id % 86400) * interval '1 second';

-- name: explain_prefix
explain (analyze, buffers, costs off)
