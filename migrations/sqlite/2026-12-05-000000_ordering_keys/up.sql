-- Ordering keys. A keyed message carries its key and its place in the key's
-- order: the key's sequence number, counted per topic and key by the
-- publishing module, key_publisher (which is not always the outbox's own
-- module: a dead letter put back goes into its handler's module's outbox).
ALTER TABLE tickbox_outbox ADD COLUMN ordering_key TEXT;
ALTER TABLE tickbox_outbox ADD COLUMN key_seq BIGINT;
ALTER TABLE tickbox_outbox ADD COLUMN key_publisher TEXT;
-- When the key's previous message was published (NULL for its first).
ALTER TABLE tickbox_outbox ADD COLUMN key_previous_at_us BIGINT;
CREATE INDEX tickbox_outbox_pending_keys ON tickbox_outbox (topic, ordering_key, key_seq)
    WHERE delivered_at_us IS NULL AND ordering_key IS NOT NULL;

-- The last sequence number this module gave each key of a topic, when that
-- message was published, and when the one before it was.
CREATE TABLE tickbox_key_sequences (
    topic          TEXT NOT NULL,
    ordering_key   TEXT NOT NULL,
    last_seq       BIGINT NOT NULL,
    last_at_us     BIGINT NOT NULL,
    previous_at_us BIGINT,
    PRIMARY KEY (topic, ordering_key)
) WITHOUT ROWID;

-- How far each handler of this module has got in each key's order: the
-- sequence number of the last message of the key it handled (or that an
-- operator skipped), per publishing module and topic.
CREATE TABLE tickbox_key_progress (
    handler      TEXT NOT NULL,
    publisher    TEXT NOT NULL,
    topic        TEXT NOT NULL,
    ordering_key TEXT NOT NULL,
    last_seq     BIGINT NOT NULL,
    PRIMARY KEY (handler, publisher, topic, ordering_key)
) WITHOUT ROWID;

-- A keyed dead letter parks its key for its handler: the key's later
-- messages are recorded here too, parked_behind naming the message they
-- wait for, until it is replayed or skipped.
ALTER TABLE tickbox_dead_letters ADD COLUMN ordering_key TEXT;
ALTER TABLE tickbox_dead_letters ADD COLUMN key_seq BIGINT;
ALTER TABLE tickbox_dead_letters ADD COLUMN key_publisher TEXT;
ALTER TABLE tickbox_dead_letters ADD COLUMN key_previous_at_us BIGINT;
ALTER TABLE tickbox_dead_letters ADD COLUMN parked_behind BLOB;
CREATE INDEX tickbox_dead_letters_keys ON tickbox_dead_letters (handler, key_publisher, topic, ordering_key, key_seq)
    WHERE ordering_key IS NOT NULL;

-- When each handler of this module first started: a key's message whose
-- predecessor was published before then may start the key for the handler
-- (that predecessor was never owed to it); otherwise a key starts at 1.
CREATE TABLE tickbox_handlers (
    handler             TEXT PRIMARY KEY NOT NULL,
    first_started_at_us BIGINT NOT NULL
);

INSERT INTO tickbox_schema_version (version) VALUES ('20261205000000');
