-- Which handlers, in any process, subscribe to this outbox's topics. A
-- pending message is owed to every subscription of its topic; it is
-- delivered once each of them is done with it. id is derived from
-- (module, handler), so every process computes the same one.
CREATE TABLE IF NOT EXISTS tickbox_subscriptions (
    id               BINARY(16) NOT NULL PRIMARY KEY,
    module           VARBINARY(255) NOT NULL,
    handler          VARBINARY(255) NOT NULL,
    topic            VARBINARY(255) NOT NULL,
    subscribed_at_us BIGINT NOT NULL,
    -- The last time a running bus serving it said so, and until when that
    -- holds (a bus that stops sets it to the moment it stopped).
    seen_at_us       BIGINT NOT NULL,
    alive_until_us   BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;
SET @ddl = IF((SELECT count(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'tickbox_subscriptions' AND index_name = 'tickbox_subscriptions_topic') = 0,
    'CREATE INDEX tickbox_subscriptions_topic ON tickbox_subscriptions (topic)',
    'DO 0');
PREPARE ddl FROM @ddl;
EXECUTE ddl;
DEALLOCATE PREPARE ddl;

-- Subscriptions already done with a pending message that others still owe
-- (processes serving different handlers): one row per message and
-- subscription, deleted when the message is delivered.
CREATE TABLE IF NOT EXISTS tickbox_outbox_done (
    message_id   BINARY(16) NOT NULL,
    subscription BINARY(16) NOT NULL,
    PRIMARY KEY (message_id, subscription)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;
