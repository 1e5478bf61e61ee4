-- Scheduled messages. A message published to be delivered later carries
-- when it is due (NULL: as soon as it commits), and an id whose UUIDv7 time
-- is that due time: the pending index (tickbox_outbox_pending, on id) is
-- then also the index by due time, and a scan that reads it up to now never
-- reads the rows due later. A scheduled keyed message has no key_seq until
-- it is due: it is numbered in its key then.
ALTER TABLE tickbox_outbox ADD COLUMN due_at_us BIGINT;

INSERT INTO tickbox_schema_version (version) VALUES ('20261208000000');
