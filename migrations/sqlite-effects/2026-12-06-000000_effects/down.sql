DROP TABLE tickbox_effects;
DROP TABLE tickbox_schema_version;
