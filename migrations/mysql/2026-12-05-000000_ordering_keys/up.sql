-- Ordering keys. A keyed message carries its key and its place in the key's
-- order: the key's sequence number, counted per topic and key by the
-- publishing module, key_publisher (which is not always the outbox's own
-- module: a dead letter put back goes into its handler's module's outbox).
-- key_previous_at_us: when the key's previous message was published (NULL
-- for its first).
SET @ddl = IF((SELECT count(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'tickbox_outbox' AND column_name = 'ordering_key') = 0,
    'ALTER TABLE tickbox_outbox ADD COLUMN ordering_key VARBINARY(512), ADD COLUMN key_seq BIGINT, ADD COLUMN key_publisher VARBINARY(255), ADD COLUMN key_previous_at_us BIGINT',
    'DO 0');
PREPARE ddl FROM @ddl;
EXECUTE ddl;
DEALLOCATE PREPARE ddl;
-- PostgreSQL's partial index on the pending keyed rows (topic, ordering_key,
-- key_seq WHERE delivered_at_us IS NULL AND ordering_key IS NOT NULL): with
-- delivered_at_us before key_seq, "the pending rows of this key before this
-- sequence number" is one range of it.
SET @ddl = IF((SELECT count(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'tickbox_outbox' AND index_name = 'tickbox_outbox_pending_keys') = 0,
    'CREATE INDEX tickbox_outbox_pending_keys ON tickbox_outbox (topic, ordering_key, delivered_at_us, key_seq)',
    'DO 0');
PREPARE ddl FROM @ddl;
EXECUTE ddl;
DEALLOCATE PREPARE ddl;

-- The last sequence number this module gave each key of a topic, when that
-- message was published, and when the one before it was.
CREATE TABLE IF NOT EXISTS tickbox_key_sequences (
    topic          VARBINARY(255) NOT NULL,
    ordering_key   VARBINARY(512) NOT NULL,
    last_seq       BIGINT NOT NULL,
    last_at_us     BIGINT NOT NULL,
    previous_at_us BIGINT,
    PRIMARY KEY (topic, ordering_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;

-- How far each handler of this module has got in each key's order: the
-- sequence number of the last message of the key it handled (or that an
-- operator skipped), per publishing module and topic.
CREATE TABLE IF NOT EXISTS tickbox_key_progress (
    handler      VARBINARY(255) NOT NULL,
    publisher    VARBINARY(255) NOT NULL,
    topic        VARBINARY(255) NOT NULL,
    ordering_key VARBINARY(512) NOT NULL,
    last_seq     BIGINT NOT NULL,
    PRIMARY KEY (handler, publisher, topic, ordering_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;

-- A keyed dead letter parks its key for its handler: the key's later
-- messages are recorded here too, parked_behind naming the message they
-- wait for, until it is replayed or skipped.
SET @ddl = IF((SELECT count(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'tickbox_dead_letters' AND column_name = 'ordering_key') = 0,
    'ALTER TABLE tickbox_dead_letters ADD COLUMN ordering_key VARBINARY(512), ADD COLUMN key_seq BIGINT, ADD COLUMN key_publisher VARBINARY(255), ADD COLUMN key_previous_at_us BIGINT, ADD COLUMN parked_behind BINARY(16)',
    'DO 0');
PREPARE ddl FROM @ddl;
EXECUTE ddl;
DEALLOCATE PREPARE ddl;
-- PostgreSQL's index is partial (WHERE ordering_key IS NOT NULL); here the
-- unkeyed dead letters are in it too, under a NULL ordering_key, which no
-- lookup of a key reaches.
SET @ddl = IF((SELECT count(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'tickbox_dead_letters' AND index_name = 'tickbox_dead_letters_keys') = 0,
    'CREATE INDEX tickbox_dead_letters_keys ON tickbox_dead_letters (handler, key_publisher, topic, ordering_key, key_seq)',
    'DO 0');
PREPARE ddl FROM @ddl;
EXECUTE ddl;
DEALLOCATE PREPARE ddl;

-- When each handler of this module first started: a key's message whose
-- predecessor was published before then may start the key for the handler
-- (that predecessor was never owed to it); otherwise a key starts at 1.
CREATE TABLE IF NOT EXISTS tickbox_handlers (
    handler             VARBINARY(255) NOT NULL PRIMARY KEY,
    first_started_at_us BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;

INSERT INTO tickbox_schema_version (version) VALUES ('20261205000000')
ON DUPLICATE KEY UPDATE version = version;
