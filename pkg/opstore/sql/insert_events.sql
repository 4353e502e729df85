-- An operation's first events, in the order given: their ids follow it, and so does the history. Plain rows: the
-- audit record seals them later (package audit).
INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor, detail, attempt_id, outcome)
SELECT $1, $2, v.type, v.from_state, v.to_state, v.actor, v.detail::jsonb, v.attempt_id, v.outcome
FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[])
     WITH ORDINALITY AS v(type, from_state, to_state, actor, detail, attempt_id, outcome, ord)
ORDER BY v.ord
