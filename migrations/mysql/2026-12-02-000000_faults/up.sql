-- Claims, so several processes can share an outbox.
SET @ddl = IF((SELECT count(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'tickbox_outbox' AND column_name = 'claimed_by') = 0,
    'ALTER TABLE tickbox_outbox ADD COLUMN claimed_by BINARY(16), ADD COLUMN claimed_until_us BIGINT',
    'DO 0');
PREPARE ddl FROM @ddl;
EXECUTE ddl;
DEALLOCATE PREPARE ddl;

-- Deliveries given up on: after the last attempt, a permanent error, or a
-- payload that cannot be decoded. Kept until replayed or discarded.
-- handler is '' when no handler could be chosen (an unknown topic).
CREATE TABLE IF NOT EXISTS tickbox_dead_letters (
    message_id      BINARY(16) NOT NULL,
    handler         VARBINARY(255) NOT NULL,
    topic           VARBINARY(255) NOT NULL,
    payload         LONGTEXT NOT NULL,
    correlation_id  BINARY(16) NOT NULL,
    causation_id    BINARY(16),
    created_at_us   BIGINT NOT NULL,
    attempts        INTEGER NOT NULL,
    reason          LONGTEXT NOT NULL,
    dead_at_us      BIGINT NOT NULL,
    PRIMARY KEY (message_id, handler)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;
