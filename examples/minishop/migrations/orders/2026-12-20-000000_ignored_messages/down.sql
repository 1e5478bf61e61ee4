DROP TABLE ignored_messages;
