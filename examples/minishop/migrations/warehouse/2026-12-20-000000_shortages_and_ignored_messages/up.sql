-- The warehouse answers each order once: a reservation, or a shortage here
-- (the order asked for more than was available). Written to run unchanged
-- on SQLite and PostgreSQL.
CREATE TABLE IF NOT EXISTS shortages (
    order_id    TEXT PRIMARY KEY NOT NULL,
    sku         TEXT NOT NULL,
    quantity    INTEGER NOT NULL,
    short_at_us BIGINT NOT NULL
);

-- An OrderPlaced for an order the warehouse has answered already is not
-- answered again but recorded here, once per message and handler, with why
-- (the same table as the orders module's).
CREATE TABLE IF NOT EXISTS ignored_messages (
    message_id    TEXT NOT NULL,
    handler       TEXT NOT NULL,
    order_id      TEXT NOT NULL,
    reason        TEXT NOT NULL,
    ignored_at_us BIGINT NOT NULL,
    PRIMARY KEY (message_id, handler)
);
