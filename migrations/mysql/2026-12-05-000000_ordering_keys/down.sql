DELETE FROM tickbox_schema_version WHERE version = '20261205000000';
DROP TABLE tickbox_handlers;
DROP INDEX tickbox_dead_letters_keys ON tickbox_dead_letters;
ALTER TABLE tickbox_dead_letters
    DROP COLUMN key_previous_at_us,
    DROP COLUMN parked_behind,
    DROP COLUMN key_publisher,
    DROP COLUMN key_seq,
    DROP COLUMN ordering_key;
DROP TABLE tickbox_key_progress;
DROP TABLE tickbox_key_sequences;
DROP INDEX tickbox_outbox_pending_keys ON tickbox_outbox;
ALTER TABLE tickbox_outbox
    DROP COLUMN key_previous_at_us,
    DROP COLUMN key_publisher,
    DROP COLUMN key_seq,
    DROP COLUMN ordering_key;
