#!/usr/bin/env bash
# The database's share of a ticket create, measured with pgbench alone (no Go, no HTTP): each variant is the
# statements one create sends, in its round trips, 32 clients, prepared statements, on a fresh database migrated
# by `retrysafe migrate`. The variants run back to back in one go so their ratios compare; absolute TPS move with
# the machine's load.
#   bare      one INSERT INTO tickets per transaction (what the baseline server does)
#   create    today's create: the read that serves retries, BEGIN, the claim, the ticket, the completion (operation,
#             two chained events linked by the writer, the chain head, the stored response), COMMIT
#   trigger   the same, with the events chained by the database's trigger (how creates were written before
#             migration 00012)
# usage: scripts/bench-db-steps.sh [SECONDS]   (needs pgbench and psql; PGHOST etc. or 127.0.0.1:5432 user postgres;
# KEEP=1 keeps the database retrysafe_db_steps to look at afterwards)
set -eu
D=${1:-10}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
db=retrysafe_db_steps
dir=$(mktemp -d); trap 'rm -rf "$dir"; [ -n "${KEEP:-}" ] || psql -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true' EXIT
psql -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null && psql -qc "CREATE DATABASE $db" >/dev/null
DATABASE_URL="postgres://$PGUSER@$PGHOST:$PGPORT/$db?sslmode=disable" go run ./cmd/retrysafe migrate >/dev/null

cat >"$dir/bare.sql" <<'SQL'
\set r random(1, 9000000000000000)
INSERT INTO tickets (id, account_id, project, title, description, priority, status) VALUES ('tkt_' || :client_id::text || '_' || :r::text, 'acct_a', 'bench', md5(:r::text), '', 'normal', 'open');
SQL

common_head='\set r random(1, 9000000000000000)
SELECT k.state, o.state FROM idempotency_keys k LEFT JOIN operations o ON o.account_id = k.account_id AND o.id = k.operation_id WHERE k.account_id = '"'acct_a'"' AND k.idempotency_key = '"'k_'"' || :client_id::text || '"'_'"' || :r::text;
BEGIN;
WITH claim AS (INSERT INTO idempotency_keys (account_id, idempotency_key, fingerprint, operation_id, state) VALUES ('"'acct_a'"', '"'k_'"' || :client_id::text || '"'_'"' || :r::text, md5(:r::text), '"'op_'"' || :client_id::text || '"'_'"' || :r::text, '"'running'"') ON CONFLICT (account_id, idempotency_key) DO NOTHING RETURNING account_id, idempotency_key, created_at) SELECT * FROM claim;
INSERT INTO tickets (id, account_id, project, title, description, priority, status) VALUES ('"'tkt_'"' || :client_id::text || '"'_'"' || :r::text, '"'acct_a'"', '"'bench'"', md5(:r::text), '"''"', '"'normal'"', '"'open'"') ON CONFLICT (account_id, source_event_id) WHERE source_event_id IS NOT NULL DO NOTHING RETURNING id, created_at;'
detail1='{"attempt_id": "att_1"}'
detail2='{"attempt_id": "att_1", "outcome": "created", "status": 201, "fingerprint": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "duration_ms": 3}'
{
  echo "$common_head"
  cat <<SQL
WITH op AS (INSERT INTO operations (id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id) VALUES ('op_' || :client_id::text || '_' || :r::text, 'acct_a', 'tickets.create', 'succeeded', 'k_' || :client_id::text || '_' || :r::text, md5(:r::text), 'ticket', 'tkt_' || :client_id::text || '_' || :r::text) RETURNING id, account_id), ev AS (INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor, detail, created_at, attempt, chain_seq, prev_hash, hash) SELECT op.id, op.account_id, v.type, v.from_state, v.to_state, v.actor, v.detail::jsonb, now(), v.attempt, v.seq, v.prev_hash, v.hash FROM op, (VALUES ('claimed', NULL, 'running', 'agent_a', '$detail1', NULL::bigint, 1::bigint, repeat('0', 64), md5('a') || md5('b')), ('completed', 'running', 'succeeded', 'agent_a', '$detail2', 1::bigint, 2::bigint, md5('a') || md5('b'), md5('c') || md5('d'))) AS v(type, from_state, to_state, actor, detail, attempt, seq, prev_hash, hash) ORDER BY v.seq), head AS (INSERT INTO audit_chain_heads (account_id, chain, seq, hash, prev_hash, attempts) SELECT account_id, id, 2, md5('c') || md5('d'), md5('a') || md5('b'), 1 FROM op), key AS (UPDATE idempotency_keys SET state = 'completed', response_status = 201, response_headers = '{}'::jsonb, response_body = '\x7b7d', completed_at = now() WHERE account_id = 'acct_a' AND idempotency_key = 'k_' || :client_id::text || '_' || :r::text AND state = 'running' RETURNING 1) SELECT (SELECT count(*) FROM key);
COMMIT;
SQL
} >"$dir/create.sql"
{
  echo "$common_head"
  cat <<SQL
WITH op AS (INSERT INTO operations (id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id) VALUES ('op_' || :client_id::text || '_' || :r::text, 'acct_a', 'tickets.create', 'succeeded', 'k_' || :client_id::text || '_' || :r::text, md5(:r::text), 'ticket', 'tkt_' || :client_id::text || '_' || :r::text) RETURNING id, account_id), ev AS (INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor, detail) SELECT op.id, op.account_id, v.type, v.from_state, v.to_state, v.actor, v.detail::jsonb FROM op, (VALUES (1, 'claimed', NULL, 'running', 'agent_a', '$detail1'), (2, 'completed', 'running', 'succeeded', 'agent_a', '$detail2')) AS v(ord, type, from_state, to_state, actor, detail) ORDER BY v.ord), key AS (UPDATE idempotency_keys SET state = 'completed', response_status = 201, response_headers = '{}'::jsonb, response_body = '\x7b7d', completed_at = now() WHERE account_id = 'acct_a' AND idempotency_key = 'k_' || :client_id::text || '_' || :r::text AND state = 'running' RETURNING 1) SELECT (SELECT count(*) FROM key);
COMMIT;
SQL
} >"$dir/trigger.sql"

printf '%-8s %10s %8s\n' variant tps ratio
base=
for v in bare create trigger; do
  tps=$(pgbench -n -M prepared -c 32 -j 2 -T "$D" -f "$dir/$v.sql" "$db" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -n1)
  base=${base:-$tps}
  printf '%-8s %10.0f %7.2fx\n' "$v" "${tps:-0}" "$(echo "${tps:-0} / $base" | bc -l)"
done
