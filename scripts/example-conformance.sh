#!/usr/bin/env bash
# Builds the two adopter examples, each its own module with gorm opened with its default config, and runs
# `retrysafe conformance` on each, every case, case 7 included:
#   examples/notes   plain net/http, pkg/auth, the operations routes, the console; examples/conformance/notes.json
#   examples/orders  gin, idemgin, pkg/auth, the operations routes; examples/conformance/orders.json
# For case 7 an example runs with RETRYSAFE_FAILPOINTS=idem.after_claim=pause, and the kill hook SIGKILLs it
# once it holds a claim and starts it again on the same address. Each example gets a database of its own on the
# PostgreSQL of TEST_DATABASE_URL's server (or scripts/devdb.sh's), dropped at the end. `make test` runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${TEST_DATABASE_URL:-}" ]; then base="${TEST_DATABASE_URL%%\?*}"; base="${base%/*}"; else base=$(scripts/devdb.sh url); fi
work=$(mktemp -d)
dbs=()
cleanup() {
  for f in "$work"/*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  for db in "${dbs[@]}"; do psql "$base/postgres" -qXc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1; done
  rm -rf "$work"
  true
}
trap cleanup EXIT

go build -o "$work/retrysafe" ./cmd/retrysafe
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo "$1"; }

# new_db NAME: creates a database of this run and exports DATABASE_URL for it.
new_db() {
  local db="retrysafe_example_${1}_$$"
  psql "$base/postgres" -qXc "CREATE DATABASE $db" >/dev/null
  dbs+=("$db")
  export DATABASE_URL="$base/$db?sslmode=disable"
}

# conform NAME REQUEST READY [CHECK]: builds examples/NAME, runs conformance cases 1-6 on it, then CHECK (a
# function) while it runs, then case 7 with a kill hook. READY is a shell command that succeeds once the example
# answers ($ADDR is set; no single quotes in it); it runs in the kill hook too.
conform() {
  local name=$1 request=$2 ready=$3 check=${4:-} bin="$work/$1" log="$work/$1.log" pidfile="$work/$1.pid"
  (cd "examples/$name" && go build -o "$bin" .)
  ADDR="127.0.0.1:$(free_port 18097)"
  export ADDR
  # start [failpoints]: the example in the background, its pid in $pidfile; waits until it answers. It is not a
  # job of this shell (the subshell exits), as the one the kill hook starts is not: both are stopped by pid.
  start() {
    (RETRYSAFE_FAILPOINTS="${1:-}" "$bin" > "$log" 2>&1 & echo $! > "$pidfile")
    for _ in $(seq 1 200); do sh -c "$ready" && return 0; sleep 0.05; done
    cat "$log" >&2
    return 1
  }
  stop() { # stop: SIGTERM to the example running now, and waits until it has exited
    local pid
    pid=$(cat "$pidfile")
    kill "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    rm -f "$pidfile"
  }

  echo "== cases 1-6 on examples/$name"
  start
  "$work/retrysafe" conformance --target "http://$ADDR" --request "$request" --cases 1,2,3,4,5,6
  if [ -n "$check" ]; then "$check"; fi
  stop

  echo "== case 7 on examples/$name: killed right after its claim"
  cat > "$work/$name-kill.sh" <<HOOK
#!/bin/sh
set -e
for _ in \$(seq 1 200); do grep -q 'failpoint idem.after_claim reached' "$log" && break; sleep 0.05; done
kill -9 "\$(cat "$pidfile")"
RETRYSAFE_FAILPOINTS= "$bin" > "$log" 2>&1 &
echo \$! > "$pidfile"
for _ in \$(seq 1 200); do sh -c '$ready' && exit 0; sleep 0.05; done
exit 1
HOOK
  sed 's#^{#{"kill_hook": "sh '"$work/$name"'-kill.sh",#' "$request" > "$work/$name-kill.json"
  start idem.after_claim=pause
  "$work/retrysafe" conformance --target "http://$ADDR" --request "$work/$name-kill.json" --cases 7
  stop
}

# no_duplicates TABLE COLUMN: every row the run made is one effect of one key, so no COLUMN value has two rows.
no_duplicates() {
  local dup
  dup=$(psql "$DATABASE_URL" -tAXc "SELECT count(*) FROM (SELECT $2 FROM $1 GROUP BY $2 HAVING count(*) > 1) d")
  if [ "$dup" != "0" ]; then echo "$1: $dup values of $2 with two rows" >&2; exit 1; fi
}

# no_demo_tables: the example migrated only the library's tables (migrations.Up) and its own, none of the demo
# services' (services/schema).
no_demo_tables() {
  local demo
  demo=$(psql "$DATABASE_URL" -tAXc "SELECT string_agg(tablename, ' ') FROM pg_tables WHERE schemaname = current_schema()
    AND (tablename ~ '^(ticket|payment_|deploy|environment)' OR tablename = 'retrysafe_demo_version')")
  if [ -n "$demo" ]; then echo "the example's database has the demo services' tables: $demo" >&2; exit 1; fi
}

# notes_operations: the operations routes of examples/notes (net/http) find a write by its key, succeeded, with
# its note, and show its timeline.
notes_operations() {
  local key="operations-check-$$" note op id timeline
  note=$(curl -sf "http://$ADDR/v1/notes" -H "Authorization: Bearer $NOTES_TOKEN" -H "Idempotency-Key: $key" \
    -H 'Content-Type: application/json' -d '{"author":"operations-check","text":"look me up"}' |
    grep -o '"id":"note_[^"]*"') || true
  op=$(curl -s "http://$ADDR/v1/operations?idempotency_key=$key" -H "Authorization: Bearer $NOTES_TOKEN") || true
  id=$(grep -o '"id":"op_[^"]*"' <<< "$op" | head -1 | cut -d'"' -f4) || true
  timeline=$(curl -s "http://$ADDR/v1/operations/$id/timeline" -H "Authorization: Bearer $NOTES_TOKEN") || true
  if [ -z "$note" ] || ! grep -q '"state":"succeeded"' <<< "$op" || ! grep -qF "$note" <<< "$op" || ! grep -qF "\"$id\"" <<< "$timeline"; then
    echo "examples/notes: GET /v1/operations?idempotency_key=$key does not show the note $note succeeded: $op; timeline: $timeline" >&2
    return 1
  fi
  echo "examples/notes: the operations routes find the write by its key"
  notes_console "$id"
}

# notes_console OP: a person signs in to the console of examples/notes with its key, and its operation page
# shows OP's timeline.
notes_console() {
  local jar="$work/notes-console.jar" csrf page
  csrf=$(curl -s -c "$jar" "http://$ADDR/console/signin" | grep -o 'name="csrf_token" value="[^"]*"' | cut -d'"' -f4) || true
  curl -s -o /dev/null -b "$jar" -c "$jar" "http://$ADDR/console/signin" \
    --data-urlencode "csrf_token=$csrf" --data-urlencode "key=$NOTES_TOKEN" || true
  page=$(curl -s -b "$jar" "http://$ADDR/console/operations/$1") || true
  if [ -z "$csrf" ] || ! grep -qF "$1" <<< "$page" || ! grep -q 'notes.create' <<< "$page"; then
    echo "examples/notes: the console does not show operation $1 after a sign-in: $page" >&2
    return 1
  fi
  echo "examples/notes: the console shows the operation to a person signed in with the key"
}

notes() {
  new_db notes
  export NOTES_TOKEN="notes-token-$$-never-printed"
  conform notes examples/conformance/notes.json \
    'curl -s -o /dev/null -H "Authorization: Bearer $NOTES_TOKEN" "http://$ADDR/v1/notes?author=x"' notes_operations
  no_duplicates example_notes author
  no_demo_tables
  echo "examples/notes: conformance passed, every case"
}

# orders_operations: the operations routes of examples/orders find a write by its key, succeeded, with its order.
orders_operations() {
  local key="operations-check-$$" order op
  order=$(curl -sf "http://$ADDR/v1/orders" -H "Authorization: Bearer $SHOP_TOKEN" -H "Idempotency-Key: $key" \
    -H 'Content-Type: application/json' -d '{"customer":"operations-check","sku":"book","quantity":1}' |
    grep -o '"id":"ord_[^"]*"') || true
  op=$(curl -s "http://$ADDR/v1/operations?idempotency_key=$key" -H "Authorization: Bearer $SHOP_TOKEN") || true
  if [ -z "$order" ] || ! grep -q '"state":"succeeded"' <<< "$op" || ! grep -qF "$order" <<< "$op"; then
    echo "examples/orders: GET /v1/operations?idempotency_key=$key does not show the order $order succeeded: $op" >&2
    return 1
  fi
  echo "examples/orders: the operations routes find the write by its key"
}

orders() {
  new_db orders
  export SHOP_TOKEN="shop-agent-$$-never-printed-0123456789"
  export API_KEYS="acct_shop:agent:$SHOP_TOKEN" API_KEY_ID_SECRET="example-orders-key-ids-0123456789abcdef"
  conform orders examples/conformance/orders.json 'curl -sf -o /dev/null "http://$ADDR/readyz"' orders_operations
  no_duplicates example_orders customer
  no_demo_tables
  echo "examples/orders: conformance passed, every case"
}

notes
orders
