-- Claims, so several processes can share an outbox.
ALTER TABLE tickbox_outbox ADD COLUMN claimed_by uuid, ADD COLUMN claimed_until_us bigint;

-- Deliveries given up on: after the last attempt, a permanent error, or a
-- payload that cannot be decoded. Kept until replayed or discarded.
-- handler is '' when no handler could be chosen (an unknown topic).
CREATE TABLE tickbox_dead_letters (
    message_id      uuid NOT NULL,
    handler         text NOT NULL,
    topic           text NOT NULL,
    payload         text NOT NULL,
    correlation_id  uuid NOT NULL,
    causation_id    uuid,
    created_at_us   bigint NOT NULL,
    attempts        integer NOT NULL,
    reason          text NOT NULL,
    dead_at_us      bigint NOT NULL,
    PRIMARY KEY (message_id, handler)
);
