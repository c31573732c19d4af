-- Fewer writes per attempt: every claim and every ending updates its task
-- row, and each index that row is in takes a new entry.
--
-- The listing index leaves out running tasks: a claim then adds no entry
-- to it. Running tasks are few; a listing of them reads the lease index.
--
-- The attempt log keeps no foreign key to its task. Only the claim inserts
-- attempts, in the statement that claims the task's row, so the key was
-- checked by construction; its check cost one lookup and one row lock per
-- claimed task. Deleting tasks must delete their attempts with them.

drop index {schema}.tasks_state_id;
create index tasks_state_id on {schema}.tasks (state, id desc)
    where state <> 'in_progress';

alter table {schema}.attempts drop constraint attempts_task_id_fkey;
