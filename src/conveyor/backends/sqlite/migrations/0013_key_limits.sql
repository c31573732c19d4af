-- A key's running limit once none of its tasks is pending (see the
-- PostgreSQL migration of the same purpose): the next task made pending
-- brings its own, as it would to a key whose row a claim had dropped. A
-- row trigger here runs as each row is written: of several tasks of a key
-- made pending by one statement, the first sets the limit.

drop trigger conveyor_tasks_concurrency_key_inserted;
drop trigger conveyor_tasks_concurrency_key_pending;

create trigger conveyor_tasks_concurrency_key_inserted
after insert on conveyor_tasks
when new.concurrency_key is not null and new.state = 'pending'
begin
    update conveyor_concurrency set max_running = coalesce(new.concurrency_limit, 1000000)
    where key = new.concurrency_key
      and max_running <> coalesce(new.concurrency_limit, 1000000)
      and not exists (select 1 from conveyor_tasks t
                      where t.concurrency_key = new.concurrency_key
                        and t.state = 'pending' and t.id <> new.id);
    insert or ignore into conveyor_concurrency
        (key, max_running, rate_limit, rate_period, tokens, refilled_at)
    values (new.concurrency_key, coalesce(new.concurrency_limit, 1000000), new.rate_limit,
            new.rate_period, new.rate_limit, new.created_at);
end;

create trigger conveyor_tasks_concurrency_key_pending
after update of state on conveyor_tasks
when new.concurrency_key is not null and new.state = 'pending'
begin
    update conveyor_concurrency set max_running = coalesce(new.concurrency_limit, 1000000)
    where key = new.concurrency_key
      and max_running <> coalesce(new.concurrency_limit, 1000000)
      and not exists (select 1 from conveyor_tasks t
                      where t.concurrency_key = new.concurrency_key
                        and t.state = 'pending' and t.id <> new.id);
    insert or ignore into conveyor_concurrency
        (key, max_running, rate_limit, rate_period, tokens, refilled_at)
    values (new.concurrency_key, coalesce(new.concurrency_limit, 1000000), new.rate_limit,
            new.rate_period, new.rate_limit, new.created_at);
end;
