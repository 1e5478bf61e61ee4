-- Messages published by this module. A row is pending while delivered_at_us
-- is NULL; ids are UUIDv7, so ordering by id orders by publication time.
CREATE TABLE tickbox_outbox (
    id              BLOB PRIMARY KEY NOT NULL,
    topic           TEXT NOT NULL,
    payload         TEXT NOT NULL,
    correlation_id  BLOB NOT NULL,
    causation_id    BLOB,
    created_at_us   BIGINT NOT NULL,
    delivered_at_us BIGINT
);
CREATE INDEX tickbox_outbox_pending ON tickbox_outbox (id) WHERE delivered_at_us IS NULL;

-- Messages already processed by a handler of this module: the dedup key.
CREATE TABLE tickbox_inbox (
    message_id      BLOB NOT NULL,
    handler         TEXT NOT NULL,
    processed_at_us BIGINT NOT NULL,
    PRIMARY KEY (message_id, handler)
) WITHOUT ROWID;
