-- Step workflows: a task's current step, and the step each attempt ran
-- (see the PostgreSQL migration of the same number).

alter table conveyor_tasks add column step text;
alter table conveyor_attempts add column step text;
