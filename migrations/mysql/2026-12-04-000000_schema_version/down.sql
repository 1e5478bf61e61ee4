DROP TABLE tickbox_schema_version;
