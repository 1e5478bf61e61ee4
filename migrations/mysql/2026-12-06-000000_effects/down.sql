DELETE FROM tickbox_schema_version WHERE version = '20261206000000';
DROP TABLE tickbox_effects;
