-- Progress reports (TaskContext.progress): the latest report a running
-- attempt's worker stored on its task, fenced by the lease like a
-- heartbeat. progress is the report as JSON text (conveyor.backends.stored
-- writes and reads it); progress_at is when it was stored.

alter table conveyor_tasks add column progress text;
alter table conveyor_tasks add column progress_at real;
