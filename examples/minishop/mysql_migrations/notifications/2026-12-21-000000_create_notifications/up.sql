-- The notifications module's own table on MariaDB and MySQL: that of
-- migrations/notifications/, with a VARCHAR key. Deliberately no unique key
-- on order_id: a second e-mail for an order would be a second row, which
-- minishop's final check counts.
CREATE TABLE IF NOT EXISTS sent_emails (
    id              VARCHAR(255) PRIMARY KEY NOT NULL,
    order_id        VARCHAR(255) NOT NULL,
    recipient       TEXT NOT NULL,
    subject         TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    sent_at_us      BIGINT NOT NULL,
    INDEX sent_emails_order_id (order_id)
);
