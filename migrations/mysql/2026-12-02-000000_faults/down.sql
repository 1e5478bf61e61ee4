DROP TABLE tickbox_dead_letters;
ALTER TABLE tickbox_outbox DROP COLUMN claimed_by, DROP COLUMN claimed_until_us;
