-- The orders module's own tables (tickbox's are created beside them).
-- Written to run unchanged on SQLite and PostgreSQL.
CREATE TABLE IF NOT EXISTS orders (
    id              TEXT PRIMARY KEY NOT NULL,
    customer        TEXT NOT NULL,
    sku             TEXT NOT NULL,
    quantity        INTEGER NOT NULL,
    status          TEXT NOT NULL,
    confirmations   INTEGER NOT NULL DEFAULT 0,
    placed_at_us    BIGINT NOT NULL,
    confirmed_at_us BIGINT
);

-- One row per run that places orders, so that processes running other
-- modules know whether more orders are coming. A run renews alive_until_us
-- while it places; one killed meanwhile stops renewing.
CREATE TABLE IF NOT EXISTS placing_runs (
    id             TEXT PRIMARY KEY NOT NULL,
    planned        BIGINT NOT NULL,
    started_at_us  BIGINT NOT NULL,
    alive_until_us BIGINT NOT NULL,
    ended_at_us    BIGINT
);
