-- `--confirm-within`: when an order had to be confirmed by (placed, plus the
-- window; its OrderTimedOut is due then), and when that timeout cancelled it.
-- Both NULL for an order placed without a window, or not cancelled.
-- Written to run unchanged on SQLite and PostgreSQL.
ALTER TABLE orders ADD COLUMN confirm_by_us BIGINT;
ALTER TABLE orders ADD COLUMN cancelled_at_us BIGINT;
