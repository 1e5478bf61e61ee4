-- The tickbox migrations this database has, kept apart from diesel's own
-- table, which the application's migrations share: a process refuses a
-- database holding a tickbox version it does not know (migrated by a newer
-- tickbox), whatever the application's migrations are. Every later tickbox
-- migration inserts its own version here.
CREATE TABLE IF NOT EXISTS tickbox_schema_version (
    version VARBINARY(64) NOT NULL PRIMARY KEY
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;
INSERT INTO tickbox_schema_version (version) VALUES
    ('20261201000000'),
    ('20261202000000'),
    ('20261203000000'),
    ('20261204000000')
ON DUPLICATE KEY UPDATE version = version;
