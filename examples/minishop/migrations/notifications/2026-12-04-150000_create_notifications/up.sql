-- Deliberately no unique key on order_id: a second e-mail for an order would
-- be a second row, which minishop's final check counts.
CREATE TABLE IF NOT EXISTS sent_emails (
    id              TEXT PRIMARY KEY NOT NULL,
    order_id        TEXT NOT NULL,
    recipient       TEXT NOT NULL,
    subject         TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    sent_at_us      BIGINT NOT NULL
);

CREATE INDEX IF NOT EXISTS sent_emails_order_id ON sent_emails (order_id);
