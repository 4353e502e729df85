-- How many operation_events records lie after position ($1, $2) in (xid, id) order, and the oldest one's
-- created_at: the records the audit has not sealed yet.
SELECT count(*), min(created_at) FROM operation_events WHERE (xid, id) > ($1::xid8, $2)
