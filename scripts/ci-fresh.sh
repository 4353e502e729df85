#!/usr/bin/env bash
# ci-fresh.sh: run .ci/run the way CI does, on a fresh clone of HEAD in a temporary folder. With DROP=1 the
# `retrysafe` and `test` databases are dropped first (a new machine has neither); otherwise the tests use a
# database of their own, test_fresh_<random>, created by the tests and dropped afterwards, which proves the same
# without disturbing other test runs on this PostgreSQL.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
git clone -q "$root" "$dir"
admin="postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
if [ "${DROP:-0}" = 1 ]; then
  psql "$admin" -qc "DROP DATABASE IF EXISTS retrysafe WITH (FORCE)" -c "DROP DATABASE IF EXISTS test WITH (FORCE)"
  unset TEST_DATABASE_URL
  (cd "$dir" && bash .ci/run)
else
  db="test_fresh_$RANDOM$RANDOM"
  status=0
  (cd "$dir" && TEST_DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db?sslmode=disable" bash .ci/run) || status=$?
  psql "$admin" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
  exit "$status"
fi
