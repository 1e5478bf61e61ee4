ALTER TABLE orders DROP COLUMN cancelled_at_us;
ALTER TABLE orders DROP COLUMN confirm_by_us;
