# retrysafe: `make run` starts every service; `make test` runs every test. Both need only Go: with DATABASE_URL /
# TEST_DATABASE_URL unset they use the PostgreSQL on 127.0.0.1:5432, or start a project-local one
# (scripts/devdb.sh; `make stop-db` stops it).
SHELL := /bin/bash
GO ?= go
export GOTOOLCHAIN ?= local

.PHONY: env run build test test-failover lint bench bench-growth bench-go fuzz db stop-db migrate generate ci-fresh screenshots

build:
	$(GO) build -o bin/retrysafe ./cmd/retrysafe

# The demo's database: DATABASE_URL, when set, as it is; otherwise the `retrysafe` database, created if missing, on
# the PostgreSQL that scripts/devdb.sh finds or starts. Every target that talks to the demo's database uses it.
DEMO_DB = if [ -z "$$DATABASE_URL" ]; then \
	  base=$$(scripts/devdb.sh url) && scripts/devdb.sh createdb retrysafe && \
	  export DATABASE_URL="$$base/retrysafe?sslmode=disable"; \
	fi

# Serves tickets :8081, payments :8082, deploys :8083 and the payment provider sandbox :8090 (payments calls it over
# HTTP), each port RETRYSAFE_PORT_BASE (default 8080) plus its offset: `RETRYSAFE_PORT_BASE=9080 make run` moves
# all of them, and payments follows the provider. It first prints the line that points another terminal at it.
run: build
	@$(DEMO_DB) && { echo "In another terminal, from $(CURDIR): eval \"\$$(make -s env)\" (with the same RETRYSAFE_PORT_BASE), or:"; \
	  echo "  export PATH=\"$(CURDIR)/bin:\$$PATH\"; $$(./bin/retrysafe env)"; } >&2 && scripts/run.sh

# One line for a shell: eval "$$(make -s env)" puts bin/ on PATH and exports RETRYSAFE_PORT_BASE, the services'
# URLs (TICKETS_URL, PAYMENTS_URL, DEPLOYS_URL, PROVIDER_URL), KILL_HOOK_PORT and the DATABASE_URL of make run,
# so the README's commands, `retrysafe agent` and `retrysafe audit` find the demo wherever it runs.
env: build
	@$(DEMO_DB) && echo "export PATH=\"$(CURDIR)/bin:\$$PATH\"; $$(./bin/retrysafe env)"

# Creates the retrysafe database on the development PostgreSQL (make run does this itself).
db:
	@scripts/devdb.sh createdb retrysafe

# Stops the project-local PostgreSQL cluster that make run or make test started (the system one is left alone).
stop-db:
	@scripts/devdb.sh stop

migrate: build
	@$(DEMO_DB) && ./bin/retrysafe migrate

# Every test, on a real PostgreSQL: TEST_DATABASE_URL, or the `test` database (created by the tests when missing)
# on the PostgreSQL that scripts/devdb.sh finds or starts. Fuzz targets run their seed corpus.
# Then scripts/example-conformance.sh builds examples/notes (net/http) and examples/orders (gin), each its own
# module, and runs every conformance case on each. cmd/retrysafe's TestTypeScriptClient runs the node tests of
# api/ts (npm ci there once) against a tickets service; TestMCPTypeScriptClient drives `retrysafe mcp` with the
# official TypeScript MCP SDK client (api/mcp-ts).
test:
	$(GO) vet ./...
	cd examples/notes && $(GO) vet ./...
	cd examples/orders && $(GO) vet ./...
	@if [ -z "$$TEST_DATABASE_URL" ]; then \
	  export TEST_DATABASE_URL="$$(scripts/devdb.sh url)/test?sslmode=disable"; \
	fi && $(GO) test -count=1 -p 2 -timeout 20m ./... && scripts/example-conformance.sh

# The database failover test (internal/failovertest; docs/failover.md): scripts/failover.sh starts a
# PostgreSQL primary and a streaming-replication standby on ports of their own (never the system cluster), the
# services run on the multi-host URL under load, the primary is killed and the standby promoted, synchronous then
# asynchronous, and the old primary comes back as a standby; a few minutes. It runs in a session of its own, so
# that whatever it started is stopped on the way out, even when it fails or its timeout kills it.
test-failover:
	@root=$$(mktemp -d /tmp/retrysafe-failover.XXXXXX) && chmod 755 "$$root" && \
	trap 'kill -- -$$pid 2>/dev/null; for d in "$$root"/*/; do [ -d "$$d" ] && FAILOVER_DIR="$$d" scripts/failover.sh stop; done; rm -rf "$$root"' EXIT && \
	{ RETRYSAFE_FAILOVER=1 RETRYSAFE_FAILOVER_ROOT="$$root" setsid $(GO) test -count=1 -v -timeout 15m -run '^TestFailover$$' ./internal/failovertest/ & pid=$$!; } && \
	wait $$pid

# gofmt, go vet, staticcheck, deadcode (functions no program or test reaches; examples without output are
# documentation, not counted), and Spectral (spectral:oas plus api/.spectral.yaml) on api/openapi.yaml; any warning fails.
lint: api/node_modules/.package-lock.json
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt -l:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	@dead=$$($(GO) run golang.org/x/tools/cmd/deadcode@v0.52.0 -test ./... 2>&1 | grep -v -e '_test\.go:' -e '^go: downloading' || true); \
	  if [ -n "$$dead" ]; then echo "deadcode:"; echo "$$dead"; exit 1; fi
	cd api && node_modules/.bin/spectral lint --ruleset .spectral.yaml --fail-severity=warn openapi.yaml

# npm ci once per lock file: npm records what it installed in node_modules/.package-lock.json.
api/node_modules/.package-lock.json: api/package-lock.json
	cd api && npm ci --no-audit --no-fund
api/ts/node_modules/.package-lock.json: api/ts/package-lock.json
	cd api/ts && npm ci --no-audit --no-fund
api/mcp-ts/node_modules/.package-lock.json: api/mcp-ts/package-lock.json
	cd api/mcp-ts && npm ci --no-audit --no-fund

# The load benchmark (cmd/retrysafe-bench, docs/benchmarks.md): pgbench's one-row insert, a bare gin + gorm
# ticket insert (the baseline) and `retrysafe serve tickets`, then payments' intent create and capture against the
# provider sandbox, each process on a fresh database of the PostgreSQL that DATABASE_URL names (its server) or
# scripts/devdb.sh finds or starts; the databases are dropped at the end. Prints a table (stdout), progress
# (stderr), and draws docs/bench.png. BENCH_PRELOAD=N also measures on tables holding N completed creates
# (pkg/opstore/sql/bench_preload.sql); BENCH_FLAGS passes more flags (bin/retrysafe-bench -h).
BENCH_PRELOAD ?= 0
BENCH_FLAGS ?=
bench: build
	$(GO) build -o bin/retrysafe-bench ./cmd/retrysafe-bench
	@if [ -n "$$DATABASE_URL" ]; then base="$${DATABASE_URL%%\?*}"; base="$${base%/*}"; \
	else base=$$(scripts/devdb.sh url); fi && \
	API_KEY_ID_SECRET="$${API_KEY_ID_SECRET:-bench-secret-0123456789abcdef0123456789}" \
	  ./bin/retrysafe-bench -pg "$$base" -bin bin/retrysafe -preload $(BENCH_PRELOAD) $(BENCH_FLAGS)

# make bench with the growth run on GROWTH_ROWS (default 10M) completed creates: loading them takes a while (see
# docs/benchmarks.md) and about 3 GB of disk per million.
GROWTH_ROWS ?= 10000000
bench-growth:
	$(MAKE) bench BENCH_PRELOAD=$(GROWTH_ROWS)

# The in-process Go benchmark of the tickets router (BenchmarkCreateTicket), no second process.
bench-go:
	$(GO) test -run '^$$' -bench . -benchtime 3s -benchmem ./services/tickets/

# Runs every fuzz target of every package for FUZZTIME each (make test runs only their seed corpora). Targets
# that serve requests use the test database, as make test does. A failing input is written under the package's
# testdata/fuzz, where go test then runs it as a seed.
FUZZTIME ?= 30s
fuzz:
	@if [ -z "$$TEST_DATABASE_URL" ]; then \
	  export TEST_DATABASE_URL="$$(scripts/devdb.sh url)/test?sslmode=disable"; \
	fi && set -e && for pkg in $$($(GO) list ./...); do \
	  for target in $$($(GO) test -list '^Fuzz' "$$pkg" | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$target ($(FUZZTIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) -parallel 2 "$$pkg"; \
	  done; \
	done

# What CI does, from a fresh clone of this checkout's HEAD; DROP=1 also drops the retrysafe and test databases
# first, as on a new machine (do not use it while other test runs share this PostgreSQL).
ci-fresh:
	@scripts/ci-fresh.sh

# Regenerates both clients from api/openapi.yaml: Go in api/client (oapi-codegen; the spec's digest is recorded)
# and the TypeScript types in api/ts/src/schema.d.ts (openapi-typescript). Tests fail when either is stale.
generate: api/ts/node_modules/.package-lock.json
	cd api/client && $(GO) generate ./...
	sed -i "s/const SpecSHA256 = \".*\"/const SpecSHA256 = \"$$(sha256sum api/openapi.yaml | cut -d' ' -f1)\"/" api/client/generate.go
	cd api/ts && npm run --silent generate

# PNGs of the console (the approvals inbox, an operation's timeline, an environment) into docs/screenshots/, taken
# by the browser tests in headless chromium.
screenshots:
	@if [ -z "$$TEST_DATABASE_URL" ]; then \
	  export TEST_DATABASE_URL="$$(scripts/devdb.sh url)/test?sslmode=disable"; \
	fi && SCREENSHOTS_DIR="$(CURDIR)/docs/screenshots" $(GO) test -count=1 ./internal/consoletest/
