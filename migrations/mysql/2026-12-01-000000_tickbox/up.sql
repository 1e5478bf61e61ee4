-- tickbox on MariaDB (>= 10.6) and MySQL (>= 8.0). Every table is InnoDB,
-- utf8mb4, ROW_FORMAT=DYNAMIC (index keys up to 3072 bytes).
--
-- Ids are BINARY(16): a UUID's 16 bytes in their usual order, so ids
-- compare bytewise as on the other backends (UUIDv7 ids sort by publication
-- time). Times are BIGINT microseconds since the Unix epoch, as elsewhere.
--
-- Texts that are part of a key or an index are VARBINARY(n): MySQL cannot
-- index a TEXT column whole, and VARBINARY compares bytes exactly, like
-- PostgreSQL's text and SQLite's, on both servers: a VARCHAR would compare
-- by its collation, and every collation the two servers share ignores
-- trailing spaces ('h' = 'h '), most also case ('h' = 'H'). n is in bytes:
-- 255 for a name (module, handler, topic, effect: as long as an AMQP
-- routing key or queue name may be), 512 for an ordering key. A longer
-- value is refused by the server (strict mode), never cut short. Other
-- texts are LONGTEXT (the default largest payload is 256 KiB, past TEXT's
-- 64 KiB).
--
-- Every statement of these migrations can run again over its own work. DDL
-- commits at once on these servers, so a process killed in the middle of a
-- migration leaves the statements before the kill done and the migration
-- unrecorded; the next start runs it again from its first statement. So a
-- table is made IF NOT EXISTS, and an index or columns added to a table
-- that may have them already (neither server shares an IF NOT EXISTS for
-- those) go through a statement prepared from what information_schema
-- says: the DDL if they are missing, `DO 0` otherwise. A version row is
-- inserted ON DUPLICATE KEY UPDATE.

-- Messages published by this module. A row is pending while delivered_at_us
-- is NULL; ids are UUIDv7, so ordering by id orders by publication time.
CREATE TABLE IF NOT EXISTS tickbox_outbox (
    id              BINARY(16) NOT NULL PRIMARY KEY,
    topic           VARBINARY(255) NOT NULL,
    payload         LONGTEXT NOT NULL,
    correlation_id  BINARY(16) NOT NULL,
    causation_id    BINARY(16),
    created_at_us   BIGINT NOT NULL,
    delivered_at_us BIGINT
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;
-- PostgreSQL's partial index on pending rows (id WHERE delivered_at_us IS
-- NULL): MySQL has no partial index, so the pending rows are the ones whose
-- delivered_at_us is NULL at the front of this one, in id order (the
-- delivered rows behind them are what retention sweeps, by the same index).
SET @ddl = IF((SELECT count(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'tickbox_outbox' AND index_name = 'tickbox_outbox_pending') = 0,
    'CREATE INDEX tickbox_outbox_pending ON tickbox_outbox (delivered_at_us, id)',
    'DO 0');
PREPARE ddl FROM @ddl;
EXECUTE ddl;
DEALLOCATE PREPARE ddl;

-- Messages already processed by a handler of this module: the dedup key.
-- It is the primary key: a duplicate key met by ON DUPLICATE KEY UPDATE
-- takes an exclusive lock on the record, where a secondary unique key
-- would take a gap lock.
CREATE TABLE IF NOT EXISTS tickbox_inbox (
    message_id      BINARY(16) NOT NULL,
    handler         VARBINARY(255) NOT NULL,
    processed_at_us BIGINT NOT NULL,
    -- How many deliveries found the row already there. Not on the other
    -- backends: the inbox insert counts one here on a duplicate
    -- (ON DUPLICATE KEY UPDATE duplicates = duplicates + 1), so that its
    -- affected-row count tells a new row (1) from a duplicate (2). Without
    -- a change a duplicate also reads 1, because the connection reports
    -- found rows (CLIENT_FOUND_ROWS); INSERT IGNORE would turn every error
    -- into a warning; and a plain INSERT's duplicate-key error leaves a
    -- shared lock behind, on which three deliveries of one message
    -- deadlock when the first rolls back.
    duplicates      BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (message_id, handler)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;
