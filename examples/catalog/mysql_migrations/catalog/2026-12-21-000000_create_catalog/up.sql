-- The catalog's own tables on MariaDB and MySQL: those of
-- migrations/catalog/, with VARCHAR keys (the servers index no TEXT whole;
-- tickbox makes the module's database utf8mb4_bin, so keys compare byte
-- for byte, as on SQLite and PostgreSQL).
CREATE TABLE IF NOT EXISTS products (
    id      VARCHAR(255) PRIMARY KEY NOT NULL,
    price   BIGINT NOT NULL, -- in cents
    version BIGINT NOT NULL  -- one more per price change; 0 before any
);

-- One row per change, written in the change's own transaction with the id
-- of the message that announced it.
CREATE TABLE IF NOT EXISTS price_changes (
    message_id VARCHAR(64) PRIMARY KEY NOT NULL,
    product_id VARCHAR(255) NOT NULL,
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
