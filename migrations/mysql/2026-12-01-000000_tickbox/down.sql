DROP TABLE tickbox_inbox;
DROP TABLE tickbox_outbox;
