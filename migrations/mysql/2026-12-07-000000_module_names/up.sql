-- The names the modules that started on this database go by: a module
-- records its name, and when, each time it starts, so that a tool attaching
-- to the database by its URL (the operator's tool) names it as the
-- application does. The one started last is the database's module.
CREATE TABLE IF NOT EXISTS tickbox_modules (
    name               VARBINARY(255) NOT NULL PRIMARY KEY,
    last_started_at_us BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC;

INSERT INTO tickbox_schema_version (version) VALUES ('20261207000000')
ON DUPLICATE KEY UPDATE version = version;
