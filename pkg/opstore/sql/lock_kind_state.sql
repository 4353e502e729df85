-- An operation's kind and state, its row locked FOR UPDATE until the transaction ends (a correction of it,
-- decided one at a time).
SELECT kind, state FROM operations WHERE account_id = $1 AND id = $2 FOR UPDATE
