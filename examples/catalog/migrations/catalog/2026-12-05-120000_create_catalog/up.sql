-- The catalog's own tables: its products, the log of their price changes,
-- and the plans of changes that runs make (what --resume finishes).
CREATE TABLE IF NOT EXISTS products (
    id      TEXT PRIMARY KEY NOT NULL,
    price   BIGINT NOT NULL, -- in cents
    version BIGINT NOT NULL  -- one more per price change; 0 before any
);

-- One row per change, written in the change's own transaction with the id
-- of the message that announced it.
CREATE TABLE IF NOT EXISTS price_changes (
    message_id TEXT PRIMARY KEY NOT NULL,
    product_id TEXT NOT NULL,
    version    BIGINT NOT NULL,
    price      BIGINT NOT NULL,
    UNIQUE (product_id, version)
);

-- A run's changes: `changes` changes over `products` products, chosen with
-- `seed`; `published` of them so far, counted in each change's transaction.
CREATE TABLE IF NOT EXISTS change_plans (
    id        BIGINT PRIMARY KEY NOT NULL,
    seed      BIGINT NOT NULL,
    products  BIGINT NOT NULL,
    changes   BIGINT NOT NULL,
    published BIGINT NOT NULL,
    keyed     BOOLEAN NOT NULL
);
