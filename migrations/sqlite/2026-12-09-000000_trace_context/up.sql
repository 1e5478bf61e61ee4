-- The W3C trace context a message was published in (`traceparent`, then
-- `tracestate` on a second line if there is one), so that its trace goes on
-- in every handler, after a restart and in other processes too. NULL when
-- the publisher was in no trace, or was built without the `opentelemetry`
-- feature (processes built with and without it may share an outbox). A dead
-- letter keeps its message's, so that an operator finds its trace.
ALTER TABLE tickbox_outbox ADD COLUMN trace_context TEXT;
ALTER TABLE tickbox_dead_letters ADD COLUMN trace_context TEXT;

INSERT INTO tickbox_schema_version (version) VALUES ('20261209000000');
