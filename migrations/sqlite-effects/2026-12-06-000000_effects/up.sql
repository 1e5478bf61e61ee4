-- The effects journal of an SQLite module, in a companion file beside the
-- module's database (`<file>-effects`): a journal entry must commit while
-- the delivery's own transaction is open, and an SQLite write transaction
-- holds its whole file. One row per external effect (an e-mail, an API
-- call) a handler makes through `Delivery::effect`, keyed by the message,
-- the handler and the effect's name: `started` commits before the call,
-- `succeeded` (with the result) or `failed` after it. A row found `started`
-- again means a crash cut the call short: the effect's policy calls it
-- again with the same key, or marks it `unknown` for a person to settle
-- (`done`, or `retry` to allow one more call).
CREATE TABLE tickbox_schema_version (
    version TEXT PRIMARY KEY NOT NULL
);

CREATE TABLE tickbox_effects (
    message_id     BLOB NOT NULL,
    handler        TEXT NOT NULL,
    effect         TEXT NOT NULL,
    effect_key     TEXT NOT NULL,
    policy         TEXT NOT NULL,
    state          TEXT NOT NULL,
    calls          BIGINT NOT NULL,
    window_from_us BIGINT NOT NULL,
    updated_at_us  BIGINT NOT NULL,
    result         TEXT,
    error          TEXT,
    PRIMARY KEY (message_id, handler, effect)
) WITHOUT ROWID;
-- Retention sweeps settled rows by age; operators list the unsettled ones.
CREATE INDEX tickbox_effects_updated ON tickbox_effects (updated_at_us);
CREATE INDEX tickbox_effects_unsettled ON tickbox_effects (state)
    WHERE state <> 'succeeded' AND state <> 'failed';

INSERT INTO tickbox_schema_version (version) VALUES ('20261206000000');
