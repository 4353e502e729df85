#!/usr/bin/env bash
# failover.sh: a PostgreSQL primary and a streaming-replication standby on this machine, each in its own data
# directory and port, for the database failover test (make test-failover) and for trying a failover by hand.
#
#   scripts/failover.sh start [sync|async]  create both nodes (initdb, pg_basebackup) and start them; the standby
#                                           is synchronous unless async is asked for
#   scripts/failover.sh url DB              print the multi-host URL of database DB, as the services use it
#   scripts/failover.sh createdb DB         create database DB on the primary (it replicates)
#   scripts/failover.sh status              each node: name, port, primary | standby | down
#   scripts/failover.sh kill                kill -9 the primary's postmaster and every backend at once, like a
#                                           crash; prints the moment of the kill (seconds since the epoch)
#   scripts/failover.sh detach              stop the standby's streaming: it falls behind the primary, so that a
#                                           failover then loses the newest commits (asynchronous mode)
#   scripts/failover.sh promote             promote the standby once the primary is down (pg_ctl promote), with
#                                           synchronous_standby_names cleared first
#   scripts/failover.sh rejoin              bring the node that is down back as a standby of the new primary
#                                           (pg_rewind, or a new pg_basebackup when rewinding fails)
#   scripts/failover.sh standalone          clear synchronous_standby_names on the primary, so its commits stop
#                                           waiting for a standby that is gone
#   scripts/failover.sh stop                stop both nodes and delete their data directories
#
# Plain streaming replication, promoted with pg_ctl promote, rather than pg_auto_failover (Debian's
# postgresql-15-auto-failover): it is PostgreSQL's own mechanism, run with Debian's own binaries, and has fewer
# moving parts: no monitor node, no keeper per node, no state machine between the kill and the promotion. What
# retrysafe must survive is the same either way (a primary that dies mid-load, a standby that becomes the only
# writable node, the old primary back as a standby), and here each step is one command the test can time. The
# job of a failover manager is left to the caller: deciding that the primary is dead, promoting, and clearing
# synchronous_standby_names on the new primary so that its commits do not wait for a standby that does not exist
# (as Patroni does in synchronous_mode, unless strict).
#
# Configuration, all optional:
#   FAILOVER_DIR      where the nodes live: a/ and b/ (data), a.log and b.log, the socket and the mode
#                     (default: ~postgres/retrysafe-failover-<hash of this checkout> as root, else .pgfailover/)
#   FAILOVER_PG_BIN   the PostgreSQL binaries (default /usr/lib/postgresql/15/bin, Debian's postgresql-15, or
#                     the newest /usr/lib/postgresql/*/bin when 15 is not installed)
#   FAILOVER_PORT_A   node a's port, the first primary (default 15441)
#   FAILOVER_PORT_B   node b's port, the first standby (default 15442)
#   (below Linux's ephemeral range, 32768-60999, where an outgoing connection may hold the port a node wants)
#
# The system cluster (5432) is never touched. As root the nodes run as the postgres user (PostgreSQL refuses
# root), in a directory postgres can reach.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${FAILOVER_PG_BIN:-/usr/lib/postgresql/15/bin}"
# Another Debian release packages another major version: the newest installed then.
[ -n "${FAILOVER_PG_BIN:-}" ] || [ -x "$bin/initdb" ] || bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
port_a="${FAILOVER_PORT_A:-15441}"
port_b="${FAILOVER_PORT_B:-15442}"

say() { echo "failover: $*" >&2; }
die() { say "$*"; exit 1; }
# Every PostgreSQL binary runs as the data directories' owner, from / (the caller's directory may be closed to it).
as_pg() { if [ "$(id -u)" -eq 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi; }

dir() {
  if [ -n "${FAILOVER_DIR:-}" ]; then
    echo "$FAILOVER_DIR"
  elif [ "$(id -u)" -eq 0 ]; then
    echo "$(getent passwd postgres | cut -d: -f6)/retrysafe-failover-$(printf '%s' "$root" | sha256sum | cut -c1-12)"
  else
    echo "$root/.pgfailover"
  fi
}
base="$(dir)"

port() { if [ "$1" = a ]; then echo "$port_a"; else echo "$port_b"; fi; }
other() { if [ "$1" = a ]; then echo b; else echo a; fi; }
conninfo() { echo "host=127.0.0.1 port=$(port "$1") user=postgres dbname=postgres"; }
sql() { "$bin/psql" -X -q -v ON_ERROR_STOP=1 "$(conninfo "$1") connect_timeout=3" -tAc "$2"; }

# role prints primary, standby or down.
role() {
  local r
  if ! r=$(sql "$1" "SELECT pg_is_in_recovery()" 2>/dev/null); then
    echo down
  elif [ "$r" = t ]; then
    echo standby
  else
    echo primary
  fi
}

# node_with ROLE prints the node that has it, failing when none or both do.
node_with() {
  local ra rb
  ra=$(role a)
  rb=$(role b)
  if [ "$ra" = "$1" ] && [ "$rb" != "$1" ]; then
    echo a
  elif [ "$rb" = "$1" ] && [ "$ra" != "$1" ]; then
    echo b
  else
    die "want exactly one $1; node a is $ra, node b is $rb"
  fi
}

mode() { cat "$base/mode" 2>/dev/null || echo sync; }

start_node() {
  as_pg "$bin/pg_ctl" -D "$base/$1" -l "$base/$1.log" -w -t 60 -o "-p $(port "$1")" start >/dev/null
}

# wait_streaming NODE: until the primary reports NODE as a streaming standby.
wait_streaming() {
  local primary
  primary=$(other "$1")
  for _ in $(seq 1 120); do
    [ "$(sql "$primary" "SELECT count(*) FROM pg_stat_replication WHERE application_name = '$1' AND state = 'streaming'" 2>/dev/null)" = 1 ] && return 0
    sleep 0.5
  done
  die "node $1 is not streaming from node $primary after 60 s (see $base/$1.log)"
}

# synchronous PRIMARY: in synchronous mode, the primary's commits wait for any one standby ('*').
synchronous() {
  [ "$(mode)" = sync ] || return 0
  sql "$1" "ALTER SYSTEM SET synchronous_standby_names = '*'"
  sql "$1" "SELECT pg_reload_conf()" >/dev/null
}

# unsynchronous NODE: NODE's commits wait for no standby.
unsynchronous() {
  sql "$1" "ALTER SYSTEM RESET synchronous_standby_names"
  sql "$1" "SELECT pg_reload_conf()" >/dev/null
}

# standby_of NODE PRIMARY: NODE's data directory is a copy of PRIMARY's; make it a standby that streams from it
# under the name NODE, and that never waits for a standby of its own until it is promoted and told to.
standby_of() {
  local conf="$base/$1/postgresql.auto.conf"
  as_pg sed -i -e '/^primary_conninfo/d' -e '/^synchronous_standby_names/d' "$conf"
  as_pg sh -c "echo \"primary_conninfo = '$(conninfo "$2") application_name=$1'\" >> '$conf' && touch '$base/$1/standby.signal'"
}

cmd_start() {
  local m="${1:-sync}"
  case "$m" in sync|async) ;; *) die "start takes sync or async, not $m" ;; esac
  [ -x "$bin/initdb" ] || die "no PostgreSQL server binaries in ${bin:-/usr/lib/postgresql}: apt-get install postgresql"
  if [ -e "$base/a/PG_VERSION" ] || [ -e "$base/b/PG_VERSION" ]; then
    die "$base holds nodes already: scripts/failover.sh stop first"
  fi
  # A start that fails half way leaves nothing running.
  trap 'if [ -z "${started:-}" ]; then say "start failed: stopping what it started"; cmd_stop; fi' EXIT
  mkdir -p "$base"
  [ "$(id -u)" -eq 0 ] && chown postgres: "$base"
  as_pg sh -c "echo $m > '$base/mode'"
  say "node a: primary on 127.0.0.1:$port_a ($base/a)"
  as_pg "$bin/initdb" -D "$base/a" -U postgres --auth=trust -E UTF8 --no-instructions >/dev/null
  # wal_log_hints: pg_rewind can bring a crashed primary back as a standby. Small buffers: a test machine.
  as_pg sh -c "cat >> '$base/a/postgresql.conf'" <<EOF
listen_addresses = '127.0.0.1'
unix_socket_directories = '$base'
wal_level = replica
max_wal_senders = 4
wal_keep_size = '256MB'
wal_log_hints = on
hot_standby = on
shared_buffers = '32MB'
max_connections = 100
EOF
  start_node a
  say "node b: $m standby on 127.0.0.1:$port_b ($base/b)"
  as_pg "$bin/pg_basebackup" -d "$(conninfo a) application_name=b" -D "$base/b" -X stream -c fast >/dev/null
  standby_of b a
  start_node b
  wait_streaming b
  synchronous a
  started=1
  say "ready: $(cmd_url postgres)"
}

cmd_url() {
  echo "postgres://postgres@127.0.0.1:$port_a,127.0.0.1:$port_b/${1:?url needs a database name}?sslmode=disable&target_session_attrs=read-write"
}

cmd_createdb() {
  local db="${1:?createdb needs a database name}" primary
  primary=$(node_with primary)
  [ "$(sql "$primary" "SELECT count(*) FROM pg_database WHERE datname = '$db'")" = 1 ] ||
    sql "$primary" "CREATE DATABASE \"$db\""
}

cmd_status() {
  for n in a b; do echo "$n $(port "$n") $(role "$n")"; done
}

cmd_kill() {
  local primary pm
  primary=$(node_with primary)
  pm=$(head -n 1 "$base/$primary/postmaster.pid")
  # The postmaster and its backends in one kill, so no backend outlives it to answer a client: a crash. The
  # moment of the kill goes to standard output (seconds since the epoch), for whoever times the failover.
  # shellcheck disable=SC2046
  kill -9 "$pm" $(ps -o pid= --ppid "$pm") 2>/dev/null || true
  date +%s.%N
  for _ in $(seq 1 50); do kill -0 "$pm" 2>/dev/null || break; sleep 0.1; done
  say "killed node $primary (postmaster $pm)"
}

cmd_detach() {
  local standby primary
  standby=$(node_with standby)
  primary=$(other "$standby")
  sql "$standby" "ALTER SYSTEM SET primary_conninfo = ''"
  sql "$standby" "SELECT pg_reload_conf()" >/dev/null
  # The reload is asynchronous: until the primary's walsender is gone, commits may still reach the standby.
  for _ in $(seq 1 100); do
    [ "$(sql "$primary" "SELECT count(*) FROM pg_stat_replication WHERE application_name = '$standby'")" = 0 ] && break
    sleep 0.1
  done
  say "node $standby no longer streams: it falls behind"
}

cmd_promote() {
  local standby
  standby=$(node_with standby)
  [ "$(role "$(other "$standby")")" = down ] || die "node $(other "$standby") is still up: kill it first (two primaries would diverge)"
  unsynchronous "$standby"
  as_pg "$bin/pg_ctl" -D "$base/$standby" -w -t 60 promote >/dev/null
  say "node $standby promoted: primary on 127.0.0.1:$(port "$standby")"
}

cmd_rejoin() {
  local down primary
  primary=$(node_with primary)
  down=$(other "$primary")
  [ "$(role "$down")" = down ] || die "node $down is not down"
  rm -f "$base/$down/postmaster.pid"
  # A promoted node records its new timeline in pg_control at its next checkpoint; until then pg_rewind takes
  # both for one timeline and rewinds nothing.
  sql "$primary" "CHECKPOINT"
  # pg_rewind runs crash recovery on the killed node first, then takes from the new primary every block the
  # two timelines disagree on: commits the old primary made alone are gone.
  if ! as_pg "$bin/pg_rewind" -D "$base/$down" --source-server="$(conninfo "$primary")" >"$base/$down.rewind.log" 2>&1; then
    say "pg_rewind failed (see $base/$down.rewind.log): copying node $primary anew"
    rm -rf "${base:?}/$down"
    as_pg "$bin/pg_basebackup" -d "$(conninfo "$primary") application_name=$down" -D "$base/$down" -X stream -c fast >/dev/null
  fi
  standby_of "$down" "$primary"
  start_node "$down"
  wait_streaming "$down"
  synchronous "$primary"
  say "node $down is a standby of node $primary"
}

cmd_standalone() {
  local primary
  primary=$(node_with primary)
  unsynchronous "$primary"
  say "node $primary commits without waiting for a standby"
}

cmd_stop() {
  for n in a b; do
    if [ -f "$base/$n/postmaster.pid" ]; then
      as_pg "$bin/pg_ctl" -D "$base/$n" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
    fi
  done
  if [ -d "$base" ]; then
    rm -rf "$base"
    say "stopped; $base removed"
  fi
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  url) shift; cmd_url "$@" ;;
  createdb) shift; cmd_createdb "$@" ;;
  status) cmd_status ;;
  kill) cmd_kill ;;
  detach) cmd_detach ;;
  promote) cmd_promote ;;
  rejoin) cmd_rejoin ;;
  standalone) cmd_standalone ;;
  stop) cmd_stop ;;
  *) echo "usage: scripts/failover.sh start [sync|async] | url DB | createdb DB | status | kill | detach | promote | rejoin | standalone | stop" >&2; exit 2 ;;
esac
