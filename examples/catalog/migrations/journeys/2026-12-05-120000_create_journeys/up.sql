-- The journeys' audit: one row per price change. The event id (product id
-- and version) is the primary key, so no code path can record an event
-- twice, inbox or not.
CREATE TABLE IF NOT EXISTS journeys (
    event_id   TEXT PRIMARY KEY NOT NULL,
    product_id TEXT NOT NULL,
    version    BIGINT NOT NULL,
    price      BIGINT NOT NULL,
    message_id TEXT NOT NULL,
    sequence   BIGINT -- the message's number in its ordering key, if keyed
);

-- Messages that carried an event already recorded, under another id.
CREATE TABLE IF NOT EXISTS repeated_events (
    message_id TEXT PRIMARY KEY NOT NULL,
    event_id   TEXT NOT NULL
);
