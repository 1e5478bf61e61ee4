-- The orders module's own tables on MariaDB and MySQL: those of
-- migrations/orders/, in the servers' words. A key is a VARCHAR (the servers
-- index no TEXT whole); tickbox makes the module's database utf8mb4_bin, so
-- keys compare byte for byte, as on SQLite and PostgreSQL.
CREATE TABLE IF NOT EXISTS orders (
    id              VARCHAR(255) PRIMARY KEY NOT NULL,
    customer        TEXT NOT NULL,
    sku             VARCHAR(255) NOT NULL,
    quantity        INTEGER NOT NULL,
    status          VARCHAR(16) NOT NULL,
    confirmations   INTEGER NOT NULL DEFAULT 0,
    placed_at_us    BIGINT NOT NULL,
    confirmed_at_us BIGINT
);

-- One row per run that places orders, so that processes running other
-- modules know whether more orders are coming. A run renews alive_until_us
-- while it places; one killed meanwhile stops renewing.
CREATE TABLE IF NOT EXISTS placing_runs (
    id             VARCHAR(255) PRIMARY KEY NOT NULL,
    planned        BIGINT NOT NULL,
    started_at_us  BIGINT NOT NULL,
    alive_until_us BIGINT NOT NULL,
    ended_at_us    BIGINT
);

-- The saga's second safeguard, beyond the inbox: a warehouse answer that
-- does not fit its order's state is recorded here, once per message and
-- handler, with why.
CREATE TABLE IF NOT EXISTS ignored_messages (
    message_id    VARCHAR(255) NOT NULL,
    handler       VARCHAR(255) NOT NULL,
    order_id      VARCHAR(255) NOT NULL,
    reason        TEXT NOT NULL,
    ignored_at_us BIGINT NOT NULL,
    PRIMARY KEY (message_id, handler)
);
