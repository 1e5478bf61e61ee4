-- Messages published by this module. A row is pending while delivered_at_us
-- is NULL; ids are UUIDv7, so ordering by id orders by publication time.
CREATE TABLE tickbox_outbox (
    id              uuid PRIMARY KEY,
    topic           text NOT NULL,
    payload         text NOT NULL,
    correlation_id  uuid NOT NULL,
    causation_id    uuid,
    created_at_us   bigint NOT NULL,
    delivered_at_us bigint
);
CREATE INDEX tickbox_outbox_pending ON tickbox_outbox (id) WHERE delivered_at_us IS NULL;

-- Messages already processed by a handler of this module: the dedup key.
CREATE TABLE tickbox_inbox (
    message_id      uuid NOT NULL,
    handler         text NOT NULL,
    processed_at_us bigint NOT NULL,
    PRIMARY KEY (message_id, handler)
);
