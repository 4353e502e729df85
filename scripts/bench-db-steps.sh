#!/usr/bin/env bash
# The database's share of a ticket create, measured with pgbench alone (no Go, no HTTP): each variant is the
# statements one create sends, in the round trips the code sends them (pgbench pipelines), 32 clients, prepared
# statements, on a fresh database migrated by `retrysafe migrate`. Besides TPS it prints the CPU the database's
# processes spent per transaction (their /proc counters, so run it as root or as postgres on the database's
# machine), which is what bounds the whole request on a machine whose cores the service shares. The variants run
# back to back in one go so their ratios compare; absolute figures move with the machine's load.
#   bare       one INSERT INTO tickets per transaction (what the baseline server does)
#   key        the least a create can send whose write runs between its claim and its completion (as a
#              WriteFunc does): the read that serves retries, then BEGIN, the key's claim and the ticket, then the
#              key's completion (its stored response) and COMMIT. No operation, no records. (One statement with
#              the answer made before the write is less again: internal/bench/ceiling.go.)
#   threerows  a schema that does not exist (scratch tables made here): one row that is both the key and the
#              operation, claimed running and completed in place, one chained record, the ticket; same round
#              trips. The issue's "at most three rows".
#   create     today's create: the read, BEGIN with the claim and the ticket, then the completion (the operation,
#              its two records as plain rows, the stored response) with COMMIT
# usage: scripts/bench-db-steps.sh [SECONDS]   (needs pgbench and psql; PGHOST etc. or 127.0.0.1:5432 user postgres;
# KEEP=1 keeps the database retrysafe_db_steps to look at afterwards)
set -eu
D=${1:-10}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
db=retrysafe_db_steps
dir=$(mktemp -d); trap 'rm -rf "$dir"; [ -n "${KEEP:-}" ] || psql -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true' EXIT
psql -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 && psql -qc "CREATE DATABASE $db" >/dev/null
DATABASE_URL="postgres://$PGUSER@$PGHOST:$PGPORT/$db?sslmode=disable" go run ./cmd/retrysafe migrate >/dev/null
# The merged key-and-operation row with the indexes it would need: by key, by id (the status resource), by
# time (listings); and one record per create, keyed by its chain as operation_events is.
psql -q -d "$db" >/dev/null <<'SQL'
CREATE TABLE scratch_opkeys (
    account_id text NOT NULL, idempotency_key text NOT NULL, id text NOT NULL, kind text NOT NULL,
    state text NOT NULL, fingerprint text NOT NULL, resource_type text, resource_id text,
    response_status integer, response_headers jsonb, response_body bytea,
    created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
    chain_seq bigint NOT NULL DEFAULT 0, chain_hash text,
    PRIMARY KEY (account_id, idempotency_key), UNIQUE (account_id, id)
) WITH (fillfactor = 80);
CREATE INDEX ON scratch_opkeys (account_id, created_at, id);
CREATE TABLE scratch_records (
    account_id text NOT NULL, operation_id text NOT NULL, seq bigint NOT NULL, type text NOT NULL,
    from_state text, to_state text, actor text NOT NULL, detail jsonb NOT NULL, attempt bigint,
    created_at timestamptz NOT NULL DEFAULT now(), prev_hash text NOT NULL, hash text NOT NULL,
    PRIMARY KEY (account_id, operation_id, seq),
    FOREIGN KEY (account_id, operation_id) REFERENCES scratch_opkeys (account_id, id)
);
SQL

K="'k_' || :client_id::text || '_' || :r::text"
OP="'op_' || :client_id::text || '_' || :r::text"
TKT="'tkt_' || :client_id::text || '_' || :r::text"
ticket="INSERT INTO tickets (id, account_id, project, title, description, priority, status) VALUES ($TKT, 'acct_a', 'bench', md5(:r::text), '', 'normal', 'open') ON CONFLICT (account_id, source_event_id) WHERE source_event_id IS NOT NULL DO NOTHING RETURNING id, created_at;"
detail1='{"attempt_id": "att_1"}'
detail2='{"attempt_id": "att_1", "outcome": "created", "status": 201, "fingerprint": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "duration_ms": 3}'
H1="md5('a') || md5('b')"; H2="md5('c') || md5('d')"
r='\set r random(1, 9000000000000000)'
# The key's claim and the ticket, sent with BEGIN in one round trip: how key and create both begin.
claim="\\startpipeline
BEGIN;
INSERT INTO idempotency_keys (account_id, idempotency_key, fingerprint, operation_id, state) VALUES ('acct_a', $K, md5(:r::text), $OP, 'running');
$ticket
\\endpipeline"

printf '%s\n%s\n' "$r" "${ticket/ ON CONFLICT*RETURNING id, created_at;/;}" >"$dir/bare.sql"

cat >"$dir/key.sql" <<SQL
$r
SELECT k.state FROM idempotency_keys k WHERE k.account_id = 'acct_a' AND k.idempotency_key = $K;
$claim
\startpipeline
UPDATE idempotency_keys SET state = 'completed', response_status = 201, response_headers = '{}'::jsonb, response_body = '\x7b7d', completed_at = now() WHERE account_id = 'acct_a' AND idempotency_key = $K AND state = 'running';
COMMIT;
\endpipeline
SQL
# key.sql's key has no operation: its deferred foreign key would fail the commit.
psql -q -d "$db" -c 'ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_operation_id_fkey' >/dev/null

cat >"$dir/threerows.sql" <<SQL
$r
SELECT k.state FROM scratch_opkeys k WHERE k.account_id = 'acct_a' AND k.idempotency_key = $K;
\startpipeline
BEGIN;
INSERT INTO scratch_opkeys (account_id, idempotency_key, id, kind, state, fingerprint) VALUES ('acct_a', $K, $OP, 'tickets.create', 'running', md5(:r::text));
$ticket
\endpipeline
\startpipeline
WITH k AS (UPDATE scratch_opkeys SET state = 'succeeded', resource_type = 'ticket', resource_id = $TKT, response_status = 201, response_headers = '{}'::jsonb, response_body = '\x7b7d', updated_at = now(), chain_seq = 1, chain_hash = $H2 WHERE account_id = 'acct_a' AND idempotency_key = $K AND state = 'running' RETURNING account_id, id), ev AS (INSERT INTO scratch_records (account_id, operation_id, seq, type, from_state, to_state, actor, detail, attempt, prev_hash, hash) SELECT account_id, id, 1, 'completed', NULL, 'succeeded', 'agent_a', '$detail2'::jsonb, 1, $H1, $H2 FROM k) SELECT count(*) FROM k;
COMMIT;
\endpipeline
SQL

cat >"$dir/create.sql" <<SQL
$r
SELECT k.account_id, k.idempotency_key, k.fingerprint, k.operation_id, k.state, k.response_status, k.response_headers, k.response_body, (SELECT o.state FROM operations o WHERE o.account_id = k.account_id AND o.id = k.operation_id) FROM idempotency_keys k WHERE k.account_id = 'acct_a' AND k.idempotency_key = $K;
$claim
\startpipeline
WITH key AS (UPDATE idempotency_keys SET state = 'completed', response_status = 201, response_headers = '{}'::jsonb, response_body = '\x7b7d', completed_at = now() WHERE account_id = 'acct_a' AND idempotency_key = $K AND operation_id = $OP AND state = 'running' RETURNING account_id, operation_id), op AS (INSERT INTO operations (id, account_id, kind, state, idempotency_key, fingerprint, resource_type, resource_id) SELECT operation_id, account_id, 'tickets.create', 'succeeded', $K, md5(:r::text), 'ticket', $TKT FROM key RETURNING id, account_id), ev AS (INSERT INTO operation_events (operation_id, account_id, type, from_state, to_state, actor, detail) SELECT op.id, op.account_id, v.type, v.from_state, v.to_state, v.actor, v.detail::jsonb FROM op, (VALUES (1, 'claimed', NULL, 'running', 'agent_a', '$detail1'), (2, 'completed', 'running', 'succeeded', 'agent_a', '$detail2')) AS v(seq, type, from_state, to_state, actor, detail) ORDER BY v.seq) SELECT count(*) FROM key;
COMMIT;
\endpipeline
SQL

. "$(dirname "$0")/proc-cpu.sh" # pgticks

printf '%-10s %8s %7s %14s\n' variant tps ratio 'db CPU per tx'
base=
for v in bare key threerows create; do
  # create.sql needs the key's deferred check of its operation back (key.sql's keys have none: NOT VALID).
  [ "$v" = create ] && psql -q -d "$db" -c 'ALTER TABLE idempotency_keys ADD FOREIGN KEY (account_id, operation_id) REFERENCES operations (account_id, id) DEFERRABLE INITIALLY DEFERRED NOT VALID' >/dev/null
  c0=$(pgticks)
  out=$(pgbench -n -M prepared -c 32 -j 2 -T "$D" -f "$dir/$v.sql" "$db" 2>&1) || { echo "$v failed:"; echo "$out" | tail -5; exit 1; }
  c1=$(pgticks)
  tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -n1)
  n=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
  base=${base:-$tps}
  printf '%-10s %8.0f %6.2fx %11.0f us\n' "$v" "${tps:-0}" "$(echo "${tps:-0} / $base" | bc -l)" "$(echo "($c1 - $c0) * 10000 / $n" | bc -l)"
done
