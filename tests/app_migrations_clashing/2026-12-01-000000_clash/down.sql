DROP TABLE clash;
