-- How many operation_events records there are, for the growth run's wait for the audit to seal them.
SELECT count(*) FROM operation_events
