-- Step workflows: a task's current step, and the step each attempt ran.
--
-- A step workflow is a task whose payload is its current step's state; each
-- transition replaces step, payload, run time and the step's options, and
-- restarts the attempt budget, in the same fenced statement that closes the
-- attempt.

alter table {schema}.tasks add column step text;
alter table {schema}.attempts add column step text;
