-- settle_ended runs once per task that ends with dependents (its trigger is
-- per row): a completion batch ending the ten members of a chord runs it
-- ten times. With the default plan cache mode, each of a connection's first
-- five runs planned its statement anew (a custom plan: about a millisecond
-- each), and a worker spreads its completions over many pooled connections,
-- so most runs were planned: a batch of ten ends took 13 ms, and a chord's
-- callback started that much after its last member ended. Its statement
-- looks rows up by id and by the index on depends_on whatever its arrays
-- hold, so the generic plan is the one wanted: 6 ms for the same batch.
alter function {schema}.settle_ended(bigint[], text[], timestamptz[], text)
    set plan_cache_mode = force_generic_plan;
