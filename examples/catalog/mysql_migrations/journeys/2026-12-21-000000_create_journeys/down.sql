DROP TABLE IF EXISTS repeated_events;
DROP TABLE IF EXISTS journeys;
