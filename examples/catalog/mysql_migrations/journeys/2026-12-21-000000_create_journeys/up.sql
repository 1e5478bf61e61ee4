-- The journeys' audit on MariaDB and MySQL: that of migrations/journeys/,
-- with VARCHAR keys. The event id (product id and version) is the primary
-- key, so no code path can record an event twice, inbox or not.
CREATE TABLE IF NOT EXISTS journeys (
    event_id   VARCHAR(255) PRIMARY KEY NOT NULL,
    product_id VARCHAR(255) NOT NULL,
    version    BIGINT NOT NULL,
    price      BIGINT NOT NULL,
    message_id VARCHAR(64) NOT NULL,
    sequence   BIGINT -- the message's number in its ordering key, if keyed
);

-- Messages that carried an event already recorded, under another id.
CREATE TABLE IF NOT EXISTS repeated_events (
    message_id VARCHAR(64) PRIMARY KEY NOT NULL,
    event_id   VARCHAR(255) NOT NULL
);
