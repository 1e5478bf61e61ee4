-- The W3C trace context a message was published in (`traceparent`, then
-- `tracestate` on a second line if there is one), so that its trace goes on
-- in every handler, after a restart and in other processes too. NULL when
-- the publisher was in no trace, or was built without the `opentelemetry`
-- feature (processes built with and without it may share an outbox). A dead
-- letter keeps its message's, so that an operator finds its trace.
-- DDL commits on its own: each column is added unless a run cut short
-- added it already.
SET @ddl = IF((SELECT count(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'tickbox_outbox' AND column_name = 'trace_context') = 0,
    'ALTER TABLE tickbox_outbox ADD COLUMN trace_context TEXT',
    'DO 0');
PREPARE ddl FROM @ddl;
EXECUTE ddl;
DEALLOCATE PREPARE ddl;
SET @ddl = IF((SELECT count(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'tickbox_dead_letters' AND column_name = 'trace_context') = 0,
    'ALTER TABLE tickbox_dead_letters ADD COLUMN trace_context TEXT',
    'DO 0');
PREPARE ddl FROM @ddl;
EXECUTE ddl;
DEALLOCATE PREPARE ddl;

INSERT INTO tickbox_schema_version (version) VALUES ('20261209000000')
ON DUPLICATE KEY UPDATE version = version;
