DELETE FROM tickbox_schema_version WHERE version = '20261209000000';
ALTER TABLE tickbox_dead_letters DROP COLUMN trace_context;
ALTER TABLE tickbox_outbox DROP COLUMN trace_context;
