-- Progress reports (TaskContext.progress): the latest report a running
-- attempt's worker stored on its task, fenced by the lease like a
-- heartbeat. progress is the report as JSON text (conveyor.backends.stored
-- writes and reads it: done, total, note, attempt); progress_at is when the
-- store took it, by its clock. Nullable columns without defaults: adding them
-- rewrites nothing, and a task that never reports costs nothing.

alter table {schema}.tasks
    add column progress text,
    add column progress_at timestamptz;
