DROP TABLE sent_emails;
