DROP TABLE placing_runs;
DROP TABLE orders;
