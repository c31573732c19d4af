-- Trace context: the OpenTelemetry context of a task's enqueue, and of a
-- message's sender (a propagator's carrier as JSON text), read back by the
-- attempts and polls that continue their trace (conveyor.tracing). Null
-- when untraced. Nullable columns without a default: no table rewrite.

alter table {schema}.tasks add column trace_context text;
alter table {schema}.messages add column trace_context text;
