#!/usr/bin/env bash
# The CPU one request costs, by process: the server, every PostgreSQL process, the load generator. On a machine
# whose cores all three share (the benchmark's), req/s is the cores over that sum, so this is where a ratio to
# the baseline comes from (docs/benchmarks.md). Run from the project root, on the database's machine, as root
# or as the database's OS user (it reads /proc of the PostgreSQL processes).
#
#   scripts/bench-cpu.sh [-d SECONDS] name=command ...
#
# Each command is run with bash on a fresh database (DATABASE_URL, ADDR and TICKETS_ADDR set to 127.0.0.1:18100)
# and must exec its server, so that its pid is the server's, e.g.:
#
#   scripts/bench-cpu.sh baseline='exec bin/retrysafe-bench baseline' ceiling='exec bin/retrysafe-bench ceiling' \
#     retrysafe='exec bin/retrysafe serve tickets'
#
# It uses ../shared/bench's load generator (built as ../shared/bench/run.sh builds it): 3 s of creates not
# counted, then create (a new key each) and replay (1000 stored keys again), 32 clients. Prints a line per mode:
# req/s, p99 and microseconds of CPU per request of each.
set -u
D=10
while getopts "d:" o; do case $o in d) D=$OPTARG;; *) exit 2;; esac; done; shift $((OPTIND-1))
[ -d cmd/retrysafe ] || { echo "run from the project root"; exit 1; }
SHARED=$(cd ../shared/bench 2>/dev/null && pwd) || { echo "needs ../shared/bench (its load generator)"; exit 1; }
BIN=${BENCH_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/retrysafe-bench}; mkdir -p "$BIN"
LG=${LOADGEN:-$BIN/loadgen}
[ -x "$LG" ] || (cd "$SHARED" && go build -o "$LG" ./loadgen) || exit 1
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
export API_KEYS="acct_a:agent:ka-agent-secret-0001-long-enough,acct_a:approver:ka-approver-secret-0001-long-enough,acct_b:agent:kb-agent-secret-0001-long-enough"
export API_KEY_ID_SECRET=${API_KEY_ID_SECRET:-bench-secret-0123456789abcdef0123456789} RATE_LIMIT_WRITES_PER_SECOND=0
export ADDR=127.0.0.1:18100 TICKETS_ADDR=127.0.0.1:18100
db=retrysafe_bench_cpu
trap 'psql -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true' EXIT

. "$(dirname "$0")/proc-cpu.sh" # ticks, pgticks

for target in "$@"; do
  name=${target%%=*}; cmd=${target#*=}
  psql -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1; psql -qc "CREATE DATABASE $db" >/dev/null
  export DATABASE_URL="postgres://$PGUSER@$PGHOST:$PGPORT/$db?sslmode=disable"
  bash -c "$cmd" >"$BIN/cpu-$name.log" 2>&1 & pid=$!
  for _ in $(seq 1 120); do curl -s -o /dev/null "http://$ADDR/" && break; sleep 0.5; done
  "$LG" -url "http://$ADDR/v1/tickets" -c 32 -d 3s -mode create >/dev/null
  # What autovacuum would have done by now (this machine runs without it), as make bench does after its warm-up:
  # statistics, and plans the server cached on empty tables made again.
  psql -q -d "$db" -c ANALYZE >/dev/null
  for mode in create replay; do
    # The replay mode stores its 1000 keys first, in the same command, untimed: a run of that alone (-d 0s) is
    # measured first and taken off.
    seed_s=0 seed_p=0 seed_l=0
    if [ $mode = replay ]; then
      s0=$(ticks $pid); p0=$(pgticks)
      { time -p "$LG" -url "http://$ADDR/v1/tickets" -c 32 -d 0s -mode replay >/dev/null; } 2>"$BIN/cpu-time"
      seed_s=$(( $(ticks $pid) - s0 )); seed_p=$(( $(pgticks) - p0 ))
      seed_l=$(awk '/^(user|sys)/{s+=$2} END{print s*100}' "$BIN/cpu-time")
    fi
    s0=$(ticks $pid); p0=$(pgticks)
    out=$( { time -p "$LG" -url "http://$ADDR/v1/tickets" -c 32 -d "${D}s" -mode $mode; } 2>"$BIN/cpu-time") || { echo "$name $mode: load failed"; break; }
    s1=$(ticks $pid); p1=$(pgticks)
    lg=$(awk -v seed="$seed_l" '/^(user|sys)/{s+=$2} END{print s*100 - seed}' "$BIN/cpu-time")
    python3 - "$name" "$out" $((s1 - s0 - seed_s)) $((p1 - p0 - seed_p)) "$lg" <<'PY'
import json, sys
name, out = sys.argv[1], json.loads(sys.argv[2])
s, p, l = (float(x) for x in sys.argv[3:6])
n = out["requests"]
us = lambda t: t * 10_000 / n
print(f'{name:>10} {out["mode"]:>6}: {out["rps"]:7.0f} req/s, p99 {out["p99_ms"]} ms; CPU per request: '
      f'server {us(s):.0f} us, PostgreSQL {us(p):.0f} us, load generator {us(l):.0f} us, in all {us(s + p + l):.0f} us')
PY
  done
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
done
