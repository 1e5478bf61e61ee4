-- Scheduled messages. A message published to be delivered later carries
-- when it is due (NULL: as soon as it commits), and an id whose UUIDv7 time
-- is that due time: the pending index (tickbox_outbox_pending, on
-- delivered_at_us and id) is then also the index by due time, and a scan
-- that reads it up to now never reads the rows due later. A scheduled keyed
-- message has no key_seq until it is due: it is numbered in its key then.
SET @ddl = IF((SELECT count(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'tickbox_outbox' AND column_name = 'due_at_us') = 0,
    'ALTER TABLE tickbox_outbox ADD COLUMN due_at_us BIGINT',
    'DO 0');
PREPARE ddl FROM @ddl;
EXECUTE ddl;
DEALLOCATE PREPARE ddl;

INSERT INTO tickbox_schema_version (version) VALUES ('20261208000000')
ON DUPLICATE KEY UPDATE version = version;
