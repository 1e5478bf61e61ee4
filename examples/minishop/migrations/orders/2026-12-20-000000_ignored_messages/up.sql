-- The orders saga's second safeguard, beyond the inbox: a warehouse answer
-- that does not fit its order's state (the order settled already, or no such
-- order) is not applied but recorded here, once per message and handler,
-- with why. Written to run unchanged on SQLite and PostgreSQL.
CREATE TABLE IF NOT EXISTS ignored_messages (
    message_id    TEXT NOT NULL,
    handler       TEXT NOT NULL,
    order_id      TEXT NOT NULL,
    reason        TEXT NOT NULL,
    ignored_at_us BIGINT NOT NULL,
    PRIMARY KEY (message_id, handler)
);
