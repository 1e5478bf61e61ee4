ALTER TABLE orders DROP COLUMN cancelled_at_us, DROP COLUMN confirm_by_us;
