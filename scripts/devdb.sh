#!/usr/bin/env bash
# devdb.sh: the PostgreSQL that `make run` and `make test` use when DATABASE_URL / TEST_DATABASE_URL are unset.
#
#   scripts/devdb.sh url          print postgres://postgres@HOST:PORT of a running server, starting one if needed
#   scripts/devdb.sh createdb DB  create database DB on that server if it is missing
#   scripts/devdb.sh stop         stop the project-local cluster (make stop-db)
#   scripts/devdb.sh dir          print the project-local cluster's data directory
#
# A server answering on 127.0.0.1:5432 (RETRYSAFE_PG_SYSTEM_PORT; the system one, trust authentication for postgres) is used as it is.
# When nothing answers there, a project-local cluster is used: Debian's postgresql package (installed with apt
# when initdb is missing), initdb'd into .pgdata/ of the repository (gitignored), listening on 127.0.0.1 at
# RETRYSAFE_PG_PORT (default 54329) with trust authentication, logging to server.log in its data directory.
# RETRYSAFE_PG_DATA names another data directory.
#
# As root the cluster runs as the postgres user (PostgreSQL refuses root), who must be able to enter the
# repository to reach .pgdata/. A clone in root's home or in a `mktemp -d` is closed to it, so such a clone's
# cluster lives in postgres's home instead, one per clone: ~postgres/retrysafe-<hash of the clone's path>.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
port="${RETRYSAFE_PG_PORT:-54329}"
# Where an already running server is looked for first (set it to a closed port to force the local cluster).
system_port="${RETRYSAFE_PG_SYSTEM_PORT:-5432}"

say() { echo "devdb: $*" >&2; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
# PostgreSQL refuses to run as root: the cluster belongs to the postgres user then. It starts in / because the
# caller's working directory may be closed to postgres too.
as_owner() { if [ "$(id -u)" -eq 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi; }

# datadir prints the cluster's data directory (see the top of this file).
datadir() {
  if [ -n "${RETRYSAFE_PG_DATA:-}" ]; then
    echo "$RETRYSAFE_PG_DATA"
  elif [ "$(id -u)" -eq 0 ] && id -u postgres >/dev/null 2>&1 && ! runuser -u postgres -- test -x "$root"; then
    echo "$(getent passwd postgres | cut -d: -f6)/retrysafe-$(printf '%s' "$root" | sha256sum | cut -c1-12)"
  else
    echo "$root/.pgdata"
  fi
}

bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$d" ] || [ ! -x "$d/initdb" ]; then
    say "installing PostgreSQL (Debian package postgresql)"
    as_root apt-get update -qq >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql postgresql-client >&2
    d=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  fi
  echo "$d"
}

ready() { pg_isready -h 127.0.0.1 -p "$1" -q 2>/dev/null; }

local_cluster() {
  local bin data
  bin=$(bindir) # installs the package, and with it the postgres user, before datadir asks for it
  data=$(datadir)
  if [ ! -f "$data/PG_VERSION" ]; then
    say "creating a project-local cluster in $data"
    mkdir -p "$data"
    [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$data"
    as_owner "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 >/dev/null
  fi
  if ! ready "$port"; then
    say "starting it on 127.0.0.1:$port (make stop-db stops it)"
    as_owner "$bin/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $port -k $data" start >/dev/null
  fi
  echo "postgres://postgres@127.0.0.1:$port"
}

url() {
  command -v pg_isready >/dev/null || bindir >/dev/null
  if ready "$system_port"; then
    echo "postgres://postgres@127.0.0.1:$system_port"
  else
    local_cluster
  fi
}

case "${1:-}" in
  url) url ;;
  createdb)
    db="${2:?createdb needs a database name}"
    base="$(url)"
    if ! command -v psql >/dev/null; then
      say "installing psql (Debian package postgresql-client)"
      as_root apt-get update -qq >&2
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-client >&2
    fi
    psql "$base/postgres?sslmode=disable" -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1 ||
      psql "$base/postgres?sslmode=disable" -qc "CREATE DATABASE \"$db\"" >&2
    ;;
  dir) datadir ;;
  stop)
    data=$(datadir)
    if [ -f "$data/PG_VERSION" ] && ready "$port"; then
      as_owner "$(bindir)/pg_ctl" -D "$data" -w stop >/dev/null && say "stopped the project-local cluster"
    else
      say "the project-local cluster is not running"
    fi
    ;;
  *) echo "usage: scripts/devdb.sh url | createdb DB | stop | dir" >&2; exit 2 ;;
esac
