DROP TABLE app_things;
