DROP TABLE IF EXISTS stale_changes;
DROP TABLE IF EXISTS product_copies;
