DROP TABLE ignored_messages;
DROP TABLE placing_runs;
DROP TABLE orders;
