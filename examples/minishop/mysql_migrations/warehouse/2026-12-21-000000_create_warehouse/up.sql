-- The warehouse's own tables on MariaDB and MySQL, and its stock: those of
-- migrations/warehouse/, in the servers' words (VARCHAR keys, and
-- ON DUPLICATE KEY UPDATE for the seed a second process may have made).
CREATE TABLE IF NOT EXISTS stock (
    sku       VARCHAR(255) PRIMARY KEY NOT NULL,
    seeded    BIGINT NOT NULL,
    available BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS reservations (
    order_id       VARCHAR(255) PRIMARY KEY NOT NULL,
    sku            VARCHAR(255) NOT NULL,
    quantity       INTEGER NOT NULL,
    reserved_at_us BIGINT NOT NULL
);

INSERT INTO stock (sku, seeded, available) VALUES
    ('kettle', 1000000000, 1000000000),
    ('teapot', 1000000000, 1000000000),
    ('mug', 1000000000, 1000000000),
    ('spoon', 1000000000, 1000000000),
    ('tea-tin', 1000000000, 1000000000)
ON DUPLICATE KEY UPDATE sku = sku;

-- The warehouse answers each order once: a reservation, or a shortage here.
CREATE TABLE IF NOT EXISTS shortages (
    order_id    VARCHAR(255) PRIMARY KEY NOT NULL,
    sku         VARCHAR(255) NOT NULL,
    quantity    INTEGER NOT NULL,
    short_at_us BIGINT NOT NULL
);

-- An OrderPlaced for an order answered already is recorded here, once per
-- message and handler, with why (the same table as the orders module's).
CREATE TABLE IF NOT EXISTS ignored_messages (
    message_id    VARCHAR(255) NOT NULL,
    handler       VARCHAR(255) NOT NULL,
    order_id      VARCHAR(255) NOT NULL,
    reason        TEXT NOT NULL,
    ignored_at_us BIGINT NOT NULL,
    PRIMARY KEY (message_id, handler)
);
