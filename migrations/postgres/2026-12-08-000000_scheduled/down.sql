DELETE FROM tickbox_schema_version WHERE version = '20261208000000';
ALTER TABLE tickbox_outbox DROP COLUMN due_at_us;
