DROP TABLE IF EXISTS change_plans;
DROP TABLE IF EXISTS price_changes;
DROP TABLE IF EXISTS products;
