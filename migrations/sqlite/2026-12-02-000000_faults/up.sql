-- Claims (so several processes can share an outbox) and id checks: the
-- outbox is rebuilt because SQLite cannot add CHECK constraints in place.
CREATE TABLE tickbox_outbox_new (
    id               BLOB PRIMARY KEY NOT NULL CHECK (typeof(id) = 'blob' AND length(id) = 16),
    topic            TEXT NOT NULL,
    payload          TEXT NOT NULL,
    correlation_id   BLOB NOT NULL CHECK (typeof(correlation_id) = 'blob' AND length(correlation_id) = 16),
    causation_id     BLOB CHECK (causation_id IS NULL OR (typeof(causation_id) = 'blob' AND length(causation_id) = 16)),
    created_at_us    BIGINT NOT NULL,
    delivered_at_us  BIGINT,
    -- The bus instance delivering the message, until claimed_until_us.
    claimed_by       BLOB,
    claimed_until_us BIGINT
);
INSERT INTO tickbox_outbox_new (id, topic, payload, correlation_id, causation_id, created_at_us, delivered_at_us)
    SELECT id, topic, payload, correlation_id, causation_id, created_at_us, delivered_at_us FROM tickbox_outbox;
DROP TABLE tickbox_outbox;
ALTER TABLE tickbox_outbox_new RENAME TO tickbox_outbox;
CREATE INDEX tickbox_outbox_pending ON tickbox_outbox (id) WHERE delivered_at_us IS NULL;

-- Deliveries given up on: after the last attempt, a permanent error, or a
-- payload that cannot be decoded. Kept until replayed or discarded.
-- handler is '' when no handler could be chosen (an unknown topic).
CREATE TABLE tickbox_dead_letters (
    message_id      BLOB NOT NULL,
    handler         TEXT NOT NULL,
    topic           TEXT NOT NULL,
    payload         TEXT NOT NULL,
    correlation_id  BLOB NOT NULL,
    causation_id    BLOB,
    created_at_us   BIGINT NOT NULL,
    attempts        INTEGER NOT NULL,
    reason          TEXT NOT NULL,
    dead_at_us      BIGINT NOT NULL,
    PRIMARY KEY (message_id, handler)
);
