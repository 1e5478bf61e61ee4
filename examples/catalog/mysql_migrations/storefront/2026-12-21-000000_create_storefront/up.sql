-- The storefront's copy of each product's price on MariaDB and MySQL: that
-- of migrations/storefront/, with VARCHAR keys; and the changes it ignored
-- because its copy was already newer.
CREATE TABLE IF NOT EXISTS product_copies (
    product_id VARCHAR(255) PRIMARY KEY NOT NULL,
    price      BIGINT NOT NULL,
    version    BIGINT NOT NULL,
    applied    BIGINT NOT NULL -- changes applied to this copy
);

CREATE TABLE IF NOT EXISTS stale_changes (
    message_id   VARCHAR(64) PRIMARY KEY NOT NULL,
    product_id   VARCHAR(255) NOT NULL,
    version      BIGINT NOT NULL,
    held_version BIGINT NOT NULL -- the copy's version when it arrived
);
