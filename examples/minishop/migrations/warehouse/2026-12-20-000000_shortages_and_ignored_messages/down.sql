DROP TABLE ignored_messages;
DROP TABLE shortages;
