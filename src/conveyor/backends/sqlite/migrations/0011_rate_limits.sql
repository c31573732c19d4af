-- Rate limits (see the PostgreSQL migration of the same purpose): a token
-- bucket in each concurrency key's row, refilled lazily by the claim.

alter table conveyor_tasks add column rate_limit integer;
alter table conveyor_tasks add column rate_period real;
alter table conveyor_concurrency add column rate_limit integer;
alter table conveyor_concurrency add column rate_period real;
alter table conveyor_concurrency add column tokens real;
alter table conveyor_concurrency add column refilled_at real;

drop trigger conveyor_tasks_concurrency_key_inserted;
drop trigger conveyor_tasks_concurrency_key_pending;

create trigger conveyor_tasks_concurrency_key_inserted
after insert on conveyor_tasks
when new.concurrency_key is not null and new.state = 'pending'
begin
    insert or ignore into conveyor_concurrency
        (key, max_running, rate_limit, rate_period, tokens, refilled_at)
    values (new.concurrency_key, coalesce(new.concurrency_limit, 1000000), new.rate_limit,
            new.rate_period, new.rate_limit, new.created_at);
end;

create trigger conveyor_tasks_concurrency_key_pending
after update of state on conveyor_tasks
when new.concurrency_key is not null and new.state = 'pending'
begin
    insert or ignore into conveyor_concurrency
        (key, max_running, rate_limit, rate_period, tokens, refilled_at)
    values (new.concurrency_key, coalesce(new.concurrency_limit, 1000000), new.rate_limit,
            new.rate_period, new.rate_limit, new.created_at);
end;
