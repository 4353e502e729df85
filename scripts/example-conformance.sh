#!/usr/bin/env bash
# Builds examples/notes (its own module: plain net/http, gorm with its default config) and runs
# `retrysafe conformance` on it, every case, case 7 included: the example runs with
# RETRYSAFE_FAILPOINTS=idem.after_claim=pause, and the kill hook SIGKILLs it once it holds a claim and starts it
# again on the same address. Uses a database of its own on the PostgreSQL of TEST_DATABASE_URL's server (or
# scripts/devdb.sh's), dropped at the end. Then `retrysafe agent do --tools examples/tools/notes.yaml` writes a note
# through the example, killed mid-call and called again with its action id: one note. `make test` runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [ -n "${TEST_DATABASE_URL:-}" ]; then base="${TEST_DATABASE_URL%%\?*}"; base="${base%/*}"; else base=$(scripts/devdb.sh url); fi
db="retrysafe_example_notes_$$"
work=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill -9 "$(cat "$work/notes.pid" 2>/dev/null || echo "$pid")" 2>/dev/null || true
  psql "$base/postgres" -qXc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
psql "$base/postgres" -qXc "CREATE DATABASE $db" >/dev/null

go build -o "$work/retrysafe" ./cmd/retrysafe
(cd examples/notes && go build -o "$work/notes" .)

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo 18096)
export DATABASE_URL="$base/$db?sslmode=disable" NOTES_TOKEN="notes-token-$$-never-printed" ADDR="127.0.0.1:$port"
start() { # start [failpoints]: the example in the background, its pid in notes.pid; waits until it answers
  RETRYSAFE_FAILPOINTS="${1:-}" "$work/notes" > "$work/notes.log" 2>&1 &
  pid=$!
  echo "$pid" > "$work/notes.pid"
  for _ in $(seq 1 200); do
    curl -s -o /dev/null -H "Authorization: Bearer $NOTES_TOKEN" "http://$ADDR/v1/notes?author=x" && return 0
    sleep 0.05
  done
  cat "$work/notes.log" >&2
  return 1
}

echo "== cases 1-6 on examples/notes"
start
"$work/retrysafe" conformance --target "http://$ADDR" --request examples/conformance/notes.json --cases 1,2,3,4,5,6
kill "$pid"; wait "$pid" 2>/dev/null || true

echo "== case 7 on examples/notes: killed right after its claim"
cat > "$work/kill.sh" <<HOOK
#!/bin/sh
set -e
for _ in \$(seq 1 200); do grep -q 'failpoint idem.after_claim reached' "$work/notes.log" && break; sleep 0.05; done
kill -9 "\$(cat "$work/notes.pid")"
RETRYSAFE_FAILPOINTS= "$work/notes" > "$work/notes.log" 2>&1 &
echo \$! > "$work/notes.pid"
for _ in \$(seq 1 200); do curl -s -o /dev/null -H "Authorization: Bearer $NOTES_TOKEN" "http://$ADDR/v1/notes?author=x" && exit 0; sleep 0.05; done
exit 1
HOOK
sed 's#^{#{"kill_hook": "sh '"$work"'/kill.sh",#' examples/conformance/notes.json > "$work/notes-kill.json"
start idem.after_claim=pause
"$work/retrysafe" conformance --target "http://$ADDR" --request "$work/notes-kill.json" --cases 7
# Every note the run made is one effect of one key: no author has two.
dup=$(psql "$DATABASE_URL" -tAXc "SELECT count(*) FROM (SELECT author FROM example_notes GROUP BY author HAVING count(*) > 1) d")
if [ "$dup" != "0" ]; then echo "authors with two notes: $dup" >&2; exit 1; fi
echo "== retrysafe agent on examples/notes, its tools from examples/tools/notes.yaml"
kill -9 "$(cat "$work/notes.pid")" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
start
export NOTES_URL="http://$ADDR" AGENT_API_KEY="$NOTES_TOKEN"
agent() { "$work/retrysafe" agent do --tools examples/tools/notes.yaml --journal "$work/agent.journal" "$@"; }
note="{\"author\": \"agent-$$\", \"text\": \"from the agent\"}"
# A bad argument is refused before anything is journaled or sent (exit 1), and leaves the action id free.
if agent --action note-1 create_note '{"author": "", "text": "x"}' 2> "$work/agent.err"; then
  echo "an empty author was not refused" >&2; exit 1
fi
grep -q 'argument "author"' "$work/agent.err" || { cat "$work/agent.err" >&2; exit 1; }
# Killed after its request left, before it read the answer; then the same action again: one note.
RETRYSAFE_AGENT_FAILPOINTS=agent.after_send=pause "$work/retrysafe" agent do --tools examples/tools/notes.yaml \
  --journal "$work/agent.journal" --action note-1 create_note "$note" > /dev/null 2> "$work/agent.log" &
apid=$!
for _ in $(seq 1 200); do grep -q 'failpoint agent.after_send reached' "$work/agent.log" && break; sleep 0.05; done
kill -9 "$apid"; wait "$apid" 2>/dev/null || true
agent --action note-1 create_note "$note" > "$work/agent.out"
grep -q '"state":"succeeded"' "$work/agent.out" || { cat "$work/agent.out" >&2; exit 1; }
notes=$(psql "$DATABASE_URL" -tAXc "SELECT count(*) FROM example_notes WHERE author = 'agent-$$'")
if [ "$notes" != "1" ]; then echo "the agent's action made $notes notes; want 1" >&2; exit 1; fi
echo "examples/notes: conformance passed, every case; the agent's tool from a file made one note of one action"
