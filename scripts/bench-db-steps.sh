#!/usr/bin/env bash
# The database's share of a ticket create, measured with pgbench alone (no Go, no HTTP): each variant is the
# statements one create sends, in the round trips the code sends them (pgbench pipelines), 32 clients, prepared
# statements, on a fresh database migrated by `retrysafe migrate`. Besides TPS it prints the CPU the database's
# processes spent per transaction (their /proc counters, so run it as root or as postgres on the database's
# machine), which is what bounds the whole request on a machine whose cores the service shares. The variants run
# back to back in one go so their ratios compare; absolute figures move with the machine's load.
#   bare       one INSERT INTO tickets per transaction (what the baseline server does)
#   key        a create as the code sends it, without its record: the read that serves retries, then BEGIN with
#              the claim (the key's lock, and the key read again under it), then the ticket (the WriteFunc's
#              statement), then the operation inserted completed (key and stored response) with COMMIT: four round
#              trips
#   create     key, and the completion's one record (operation_events) beside it: a create whose write sends its
#              first statement through gorm, which cannot share pgx's pipeline with the claim
#   pipelined  create with the claim sent in the ticket's round trip (BEGIN, claim and ticket together): the
#              tickets create, whose insert goes through database.Query.
#              One statement with the answer made before the write is less again: internal/bench/ceiling.go.
set -eu
D=${1:-10}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
db=retrysafe_db_steps
dir=$(mktemp -d); trap 'rm -rf "$dir"; [ -n "${KEEP:-}" ] || psql -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true' EXIT
psql -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 && psql -qc "CREATE DATABASE $db" >/dev/null
DATABASE_URL="postgres://$PGUSER@$PGHOST:$PGPORT/$db?sslmode=disable" go run ./cmd/retrysafe migrate >/dev/null
K="'k_' || :client_id::text || '_' || :r::text"
TKT="'tkt_' || :client_id::text || '_' || :r::text"
ticket="INSERT INTO tickets (id, account_id, project, title, description, priority, status) VALUES ($TKT, 'acct_a', 'bench', md5(:r::text), '', 'normal', 'open') RETURNING id, created_at;"
r='\set r random(1, 9000000000000000)'
# The store's statements are its own files (pkg/opstore/sql/pgbench), read here without their comments.
steps="$(dirname "$0")/../pkg/opstore/sql/pgbench"
stmt() { sed '/^--/d' "$steps/$1.sql"; }
read=$(stmt read)
lock="SELECT pg_advisory_xact_lock(hashtextextended('acct_a' || ':' || $K, 0));"
# BEGIN with the claim in one round trip (database.Tx.Send), then the ticket in its own (through gorm).
claim="\\startpipeline
BEGIN;
$lock
$read
\\endpipeline
$ticket"
# BEGIN, the claim and the ticket in one round trip.
claimpipelined="\\startpipeline
BEGIN;
$lock
$read
$ticket
\\endpipeline"
printf '%s\n%s\n' "$r" "${ticket/ RETURNING id, created_at;/;}" >"$dir/bare.sql"

cat >"$dir/key.sql" <<SQL
$r
$read
$claim
\startpipeline
$(stmt insert)
COMMIT;
\endpipeline
SQL

completion="\\startpipeline
$(stmt complete)
COMMIT;
\\endpipeline"
printf '%s\n' "$r" "$read" "$claim" "$completion" >"$dir/create.sql"
printf '%s\n' "$r" "$read" "$claimpipelined" "$completion" >"$dir/pipelined.sql"

. "$(dirname "$0")/proc-cpu.sh" # pgticks

printf '%-10s %8s %7s %14s\n' variant tps ratio 'db CPU per tx'
base=
for v in bare key create pipelined; do
  c0=$(pgticks)
  out=$(pgbench -n -M prepared -c 32 -j 2 -T "$D" -f "$dir/$v.sql" "$db" 2>&1) || { echo "$v failed:"; echo "$out" | tail -5; exit 1; }
  c1=$(pgticks)
  tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -n1)
  n=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
  base=${base:-$tps}
  printf '%-10s %8.0f %6.2fx %11.0f us\n' "$v" "${tps:-0}" "$(echo "${tps:-0} / $base" | bc -l)" "$(echo "($c1 - $c0) * 10000 / $n" | bc -l)"
done
