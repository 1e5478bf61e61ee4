DROP TABLE ignored_messages;
DROP TABLE shortages;
DROP TABLE reservations;
DROP TABLE stock;
