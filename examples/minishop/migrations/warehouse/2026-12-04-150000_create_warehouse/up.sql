-- The warehouse's own tables, and its stock: every item far more times than
-- any run orders.
CREATE TABLE IF NOT EXISTS stock (
    sku       TEXT PRIMARY KEY NOT NULL,
    seeded    BIGINT NOT NULL,
    available BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS reservations (
    order_id       TEXT PRIMARY KEY NOT NULL,
    sku            TEXT NOT NULL,
    quantity       INTEGER NOT NULL,
    reserved_at_us BIGINT NOT NULL
);

INSERT INTO stock (sku, seeded, available) VALUES
    ('kettle', 1000000000, 1000000000),
    ('teapot', 1000000000, 1000000000),
    ('mug', 1000000000, 1000000000),
    ('spoon', 1000000000, 1000000000),
    ('tea-tin', 1000000000, 1000000000)
ON CONFLICT (sku) DO NOTHING;
