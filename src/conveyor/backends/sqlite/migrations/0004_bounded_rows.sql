-- Rows a claim can always compute with (see the PostgreSQL migration of the
-- same number). SQLite cannot add a CHECK constraint to a table without
-- rebuilding it, so triggers refuse what a CHECK would: an attempt or spent
-- counter that is not an integer from 0 to 2147483646, a lease or timeout
-- that is not a number within 100 years, a run time a datetime cannot hold.
-- They fire on inserts, and on updates of those columns only. Existing rows
-- are brought within the bounds first: a lease or timeout out of range is
-- dropped, a run time is clamped (one that is not a number becomes now), a
-- negative counter becomes 0 and any other bad one stands at the limit,
-- where the claim sets the task aside (it ends failed, saying why).

update conveyor_tasks set lease_seconds = null
where lease_seconds is not null
  and not (typeof(lease_seconds) in ('integer', 'real')
           and lease_seconds >= 0.5 and lease_seconds <= 3155760000);

update conveyor_tasks set timeout_seconds = null
where timeout_seconds is not null
  and not (typeof(timeout_seconds) in ('integer', 'real')
           and timeout_seconds > 0 and timeout_seconds <= 3155760000);

update conveyor_tasks
set run_at = case when typeof(run_at) in ('integer', 'real')
                  then min(max(run_at, -62135510400), 253402128000)
                  else (julianday('now') - 2440587.5) * 86400.0 end
where not (typeof(run_at) in ('integer', 'real')
           and run_at between -62135510400 and 253402128000);

update conveyor_tasks
set attempt = case when typeof(attempt) = 'integer' and attempt < 0 then 0 else 2147483646 end
where not (typeof(attempt) = 'integer' and attempt between 0 and 2147483646);

update conveyor_tasks
set spent = case when typeof(spent) = 'integer' and spent < 0 then 0 else 2147483646 end
where not (typeof(spent) = 'integer' and spent between 0 and 2147483646);

create trigger conveyor_tasks_in_range_on_insert
before insert on conveyor_tasks
when not (typeof(new.attempt) = 'integer' and new.attempt between 0 and 2147483646
          and typeof(new.spent) = 'integer' and new.spent between 0 and 2147483646
          and (new.lease_seconds is null
               or (typeof(new.lease_seconds) in ('integer', 'real')
                   and new.lease_seconds >= 0.5 and new.lease_seconds <= 3155760000))
          and (new.timeout_seconds is null
               or (typeof(new.timeout_seconds) in ('integer', 'real')
                   and new.timeout_seconds > 0 and new.timeout_seconds <= 3155760000))
          and typeof(new.run_at) in ('integer', 'real')
          and new.run_at between -62135510400 and 253402128000)
begin
    select raise(abort, 'conveyor_tasks: attempt, spent, lease_seconds, timeout_seconds or run_at is out of range');
end;

create trigger conveyor_tasks_in_range_on_update
before update of attempt, spent, lease_seconds, timeout_seconds, run_at on conveyor_tasks
when not (typeof(new.attempt) = 'integer' and new.attempt between 0 and 2147483646
          and typeof(new.spent) = 'integer' and new.spent between 0 and 2147483646
          and (new.lease_seconds is null
               or (typeof(new.lease_seconds) in ('integer', 'real')
                   and new.lease_seconds >= 0.5 and new.lease_seconds <= 3155760000))
          and (new.timeout_seconds is null
               or (typeof(new.timeout_seconds) in ('integer', 'real')
                   and new.timeout_seconds > 0 and new.timeout_seconds <= 3155760000))
          and typeof(new.run_at) in ('integer', 'real')
          and new.run_at between -62135510400 and 253402128000)
begin
    select raise(abort, 'conveyor_tasks: attempt, spent, lease_seconds, timeout_seconds or run_at is out of range');
end;

-- The tasks whose counters stand at the limit: claims pass them by, and
-- `quarantine` finds them here.
create index conveyor_tasks_unclaimable on conveyor_tasks (id)
    where state in ('pending', 'in_progress') and (attempt > 2147483645 or spent > 2147483645);
