-- The effects journal: one row per external effect (an e-mail, an API
-- call) a handler makes through `Delivery::effect`, keyed by the message,
-- the handler and the effect's name. Written in short transactions of its
-- own: `started` commits before the call, `succeeded` (with the result) or
-- `failed` after it. A row found `started` again means a crash cut the call
-- short: the effect's policy calls it again with the same key, or marks it
-- `unknown` for a person to settle (`done`, or `retry` to allow one more
-- call). As on PostgreSQL it is a table of the module's own database (its
-- journal connections are a pool of their own).
CREATE TABLE IF NOT EXISTS tickbox_effects (
    message_id     BINARY(16) NOT NULL,
    handler        VARBINARY(255) NOT NULL,
    effect         VARBINARY(255) NOT NULL,
    effect_key     TEXT NOT NULL,
    policy         TEXT NOT NULL,
    -- started, succeeded, failed or unknown.
    state          VARBINARY(32) NOT NULL,
    calls          BIGINT NOT NULL,
    window_from_us BIGINT NOT NULL,
    updated_at_us  BIGINT NOT NULL,
    result         LONGTEXT,
    error          LONGTEXT,
    PRIMARY KEY (message_id, handler, effect)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;
-- Retention sweeps settled rows by age; operators list the unsettled ones.
SET @ddl = IF((SELECT count(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'tickbox_effects' AND index_name = 'tickbox_effects_updated') = 0,
    'CREATE INDEX tickbox_effects_updated ON tickbox_effects (updated_at_us)',
    'DO 0');
PREPARE ddl FROM @ddl;
EXECUTE ddl;
DEALLOCATE PREPARE ddl;
-- PostgreSQL's index is partial (WHERE state <> 'succeeded' AND state <>
-- 'failed'); here every row is in it, and the unsettled ones are the
-- ranges of it outside those two values.
SET @ddl = IF((SELECT count(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'tickbox_effects' AND index_name = 'tickbox_effects_unsettled') = 0,
    'CREATE INDEX tickbox_effects_unsettled ON tickbox_effects (state)',
    'DO 0');
PREPARE ddl FROM @ddl;
EXECUTE ddl;
DEALLOCATE PREPARE ddl;

INSERT INTO tickbox_schema_version (version) VALUES ('20261206000000')
ON DUPLICATE KEY UPDATE version = version;
