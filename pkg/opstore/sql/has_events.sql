-- Whether an operation, known by its id alone, has any event.
SELECT EXISTS (SELECT 1 FROM operation_events WHERE operation_id = $1)
