DELETE FROM tickbox_schema_version WHERE version = '20261207000000';
DROP TABLE tickbox_modules;
