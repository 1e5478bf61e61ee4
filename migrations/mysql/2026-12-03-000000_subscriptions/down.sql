DROP TABLE tickbox_outbox_done;
DROP TABLE tickbox_subscriptions;
