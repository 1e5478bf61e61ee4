CREATE TABLE reservations (order_id TEXT PRIMARY KEY NOT NULL);
