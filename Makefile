# retrysafe: `make run` starts every service on a local PostgreSQL; `make test` runs every test.
SHELL := /bin/bash
GO ?= go
export GOTOOLCHAIN ?= local

DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/retrysafe?sslmode=disable
# Where `make db` connects to create the retrysafe database.
PG_ADMIN_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable
export DATABASE_URL TEST_DATABASE_URL

.PHONY: run build test bench fuzz db migrate generate

build:
	$(GO) build -o bin/retrysafe ./cmd/retrysafe

# Creates the database if it is missing, then serves tickets :8081, payments :8082, deploys :8083 and the payment
# provider sandbox :8090 (payments calls it over HTTP).
run: build db
	@trap 'kill 0' EXIT INT TERM; \
	PROVIDER_FAULT_INJECTION=$${PROVIDER_FAULT_INJECTION:-true} ./bin/retrysafe provider & \
	./bin/retrysafe serve all

db:
	@psql "$(PG_ADMIN_URL)" -tAc "SELECT 1 FROM pg_database WHERE datname = 'retrysafe'" | grep -q 1 || \
	 psql "$(PG_ADMIN_URL)" -c "CREATE DATABASE retrysafe"

migrate: build
	./bin/retrysafe migrate

# Every test, on a real PostgreSQL (TEST_DATABASE_URL); fuzz targets run their seed corpus.
test:
	$(GO) vet ./...
	$(GO) test -count=1 -p 2 -timeout 20m ./...

bench:
	$(GO) test -run '^$$' -bench . -benchtime 3s -benchmem ./services/tickets/

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParseDecimal -fuzztime 60s ./pkg/money/

# Regenerates the Go client in api/client from api/openapi.yaml (oapi-codegen) and records the spec's digest.
generate:
	cd api/client && $(GO) generate ./...
	sed -i "s/const SpecSHA256 = \".*\"/const SpecSHA256 = \"$$(sha256sum api/openapi.yaml | cut -d' ' -f1)\"/" api/client/generate.go
