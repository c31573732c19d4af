-- Rate limits: a concurrency key may also limit how many of its tasks start
-- per period, with a token bucket kept in its row: rate_limit tokens at
-- most, refilled at rate_limit per rate_period seconds, one spent per start.
-- The keyed claim reads the tokens the row has now (refilled lazily, from
-- refilled_at) under the row's lock and writes back what it spent. A key
-- with a rate keeps its row until its bucket is full again, so that a key
-- that drains and comes back cannot start more than the bucket allows.

alter table {schema}.tasks
    add column rate_limit integer check (rate_limit between 1 and 1000000),
    add column rate_period double precision check (rate_period > 0 and rate_period <= 3155760000);

alter table {schema}.concurrency
    add column rate_limit integer,
    add column rate_period double precision,
    add column tokens double precision,
    add column refilled_at timestamptz;

create or replace function {schema}.concurrency_key_pending() returns trigger
language plpgsql as $$
begin
    perform 1 from {schema}.concurrency where key = new.concurrency_key for key share;
    if not found then
        insert into {schema}.concurrency
            (key, max_running, rate_limit, rate_period, tokens, refilled_at)
        values (new.concurrency_key, coalesce(new.concurrency_limit, 1000000),
                new.rate_limit, new.rate_period, new.rate_limit, statement_timestamp())
        on conflict (key) do nothing;
        perform 1 from {schema}.concurrency where key = new.concurrency_key for key share;
    end if;
    return null;
end
$$;
