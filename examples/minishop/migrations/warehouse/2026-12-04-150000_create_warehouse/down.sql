DROP TABLE reservations;
DROP TABLE stock;
