SELECT count(*) FROM operation_events WHERE account_id = $1 AND operation_id = $2
