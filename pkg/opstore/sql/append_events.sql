-- Events that change no state, in the order given (their ids follow it). One statement text whatever the number
-- of rows (arrays, not a VALUES list per size), so it is prepared and planned once. No join with operations: the
-- foreign key, checked at COMMIT, checks that each operation exists, one primary-key probe per row (an operation a
-- local write inserts at the end of its transaction may not be there yet).
INSERT INTO operation_events (operation_id, account_id, type, actor, detail, attempt_id, outcome)
SELECT v.id, v.account_id, v.type, v.actor, v.detail::jsonb, v.attempt_id, v.outcome
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
     WITH ORDINALITY AS v(account_id, id, type, actor, detail, attempt_id, outcome, ord)
ORDER BY v.ord
