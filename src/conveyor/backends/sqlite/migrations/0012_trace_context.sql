-- Trace context (see the PostgreSQL migration of the same purpose): the
-- OpenTelemetry context of a task's enqueue and of a message's sender.

alter table conveyor_tasks add column trace_context text;
alter table conveyor_messages add column trace_context text;
