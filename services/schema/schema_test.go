package schema_test

import (
	"database/sql"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/migrations"
	"github.com/retrysafe/retrysafe/services/schema"
)

// unsplitFS is the single sequence that held the library's and the demo services' tables, as it was at its last
// version (17): what databases migrated before the split went through. Its library files are migrations' own,
// unchanged since; testdata/unsplit holds the rest as they were: the demo services' files and 00014, which the
// split trimmed to its library statements.
func unsplitFS(t *testing.T) fs.FS {
	t.Helper()
	files := fstest.MapFS{}
	for _, from := range []fs.FS{migrations.FS, os.DirFS("testdata/unsplit")} {
		names, err := fs.Glob(from, "*.sql")
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			if name[:5] > "00017" { // the library's later files came after the split
				continue
			}
			b, err := fs.ReadFile(from, name)
			if err != nil {
				t.Fatal(err)
			}
			files[name] = &fstest.MapFile{Data: b} // testdata's 00014 replaces the library's trimmed one
		}
	}
	return files
}

// TestFreshEqualsUnsplit migrates one empty schema with Up and another with the single sequence and then Up (an
// upgrade), and compares their catalogs: every column, constraint, index, trigger, function, sequence and table option is the same, so
// the demo services run on the same schema either way. The fresh one has the library's and the demo tables
// and nothing else, with nothing pending.
func TestFreshEqualsUnsplit(t *testing.T) {
	t.Parallel()
	fresh := open(t, testdb.EmptySchema(t))
	if err := schema.Up(t.Context(), fresh); err != nil {
		t.Fatal(err)
	}
	old := open(t, testdb.EmptySchema(t))
	upUnsplit(t, old, 0)
	// Up on it records the files that describe the unsplit schema as applied and runs those after them.
	if err := schema.Up(t.Context(), old); err != nil {
		t.Fatal(err)
	}

	a, b := catalog(t, fresh), catalog(t, old)
	for _, line := range a {
		if !slices.Contains(b, line) {
			t.Errorf("only after Up: %s", line)
		}
	}
	for _, line := range b {
		if !slices.Contains(a, line) {
			t.Errorf("only after the single sequence: %s", line)
		}
	}
	if len(a) < 200 {
		t.Fatalf("the catalog has %d lines: is it read in the migrated schema?", len(a))
	}

	tables := tableNames(t, fresh)
	for _, name := range append(slices.Clone(schema.Tables), schema.VersionTable, "goose_db_version", "operations") {
		if !slices.Contains(tables, name) {
			t.Errorf("Up did not create %s (it created %v)", name, tables)
		}
	}
	if pending, err := schema.Pending(t.Context(), fresh); err != nil || pending {
		t.Errorf("Pending after Up: %v, %v", pending, err)
	}
}

// TestUpgradeFromUnsplit runs Up on databases that the single sequence brought to version 17, with rows in the
// demo tables: the demo files are recorded as applied without running (their tables exist), the rows stay,
// and the schema is the fresh one. Replicas that start at once all succeed and record each version once; a
// demo version table that goose created empty (its HasPending does) is filled the same way.
func TestUpgradeFromUnsplit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		emptyRecord  bool
		replicas     int
		pendingFirst bool
	}{
		{name: "one process", replicas: 1, pendingFirst: true},
		{name: "three replicas at once", replicas: 3},
		{name: "version table created empty", replicas: 1, emptyRecord: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn := testdb.EmptySchema(t)
			db := open(t, dsn)
			upUnsplit(t, db, 0)
			mustExec(t, db, `INSERT INTO tickets (id, account_id, project, title, priority, status)
VALUES ('tkt_1', 'acct', 'ops', 'kept', 'normal', 'open')`)
			mustExec(t, db, `INSERT INTO ticket_comments (id, ticket_id, account_id, body) VALUES ('c_1', 'tkt_1', 'acct', 'kept too')`)
			if tc.emptyRecord {
				p, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS("."), goose.WithTableName(schema.VersionTable))
				if err != nil {
					t.Fatal(err)
				}
				if pending, err := p.HasPending(t.Context()); err != nil || !pending {
					t.Fatalf("goose's HasPending on the demo sequence: %v, %v", pending, err)
				}
			}
			if tc.pendingFirst {
				// /readyz asks before anyone migrates: pending, and the question leaves no record behind.
				if pending, err := schema.Pending(t.Context(), db); err != nil || !pending {
					t.Fatalf("Pending before Up: %v, %v", pending, err)
				}
				if slices.Contains(tableNames(t, db), schema.VersionTable) {
					t.Fatal("Pending created the demo version table")
				}
			}

			var wg sync.WaitGroup
			errs := make([]error, tc.replicas)
			for i := range tc.replicas {
				replica := open(t, dsn)
				wg.Go(func() { errs[i] = schema.Up(t.Context(), replica) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}

			var versions []int64
			rows, err := db.QueryContext(t.Context(), `SELECT version_id FROM `+schema.VersionTable+` WHERE is_applied ORDER BY version_id`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var v int64
				if err := rows.Scan(&v); err != nil {
					t.Fatal(err)
				}
				versions = append(versions, v)
			}
			rows.Close()
			// 0-3 recorded as the unsplit schema, 4 to 6 run on it (payments' duplicate captures, the deploy's
			// foreign key to its operation checked at COMMIT, the executions of a duplicated refund).
			if !slices.Equal(versions, []int64{0, 1, 2, 3, 4, 5, 6}) {
				t.Errorf("demo versions recorded %v, want each of 0 to 6 once", versions)
			}
			var title, body string
			if err := db.QueryRowContext(t.Context(), `SELECT t.title, c.body FROM tickets t JOIN ticket_comments c
ON c.account_id = t.account_id AND c.ticket_id = t.id`).Scan(&title, &body); err != nil || title != "kept" || body != "kept too" {
				t.Errorf("the ticket and its comment after Up: %q %q %v", title, body, err)
			}
			if pending, err := schema.Pending(t.Context(), db); err != nil || pending {
				t.Errorf("Pending after Up: %v, %v", pending, err)
			}
			if err := schema.Up(t.Context(), db); err != nil {
				t.Errorf("Up again: %v", err)
			}

			fresh := open(t, testdb.EmptySchema(t))
			if err := schema.Up(t.Context(), fresh); err != nil {
				t.Fatal(err)
			}
			if a, b := catalog(t, fresh), catalog(t, db); !slices.Equal(a, b) {
				t.Errorf("the upgraded schema differs from a fresh one")
			}
		})
	}
}

// TestRefuseOlderUnsplit: a database with the demo tables that the single sequence left before version 17 is
// refused, untouched, with what to run; the library's migrations alone would fail on it in the middle.
func TestRefuseOlderUnsplit(t *testing.T) {
	t.Parallel()
	db := open(t, testdb.EmptySchema(t))
	upUnsplit(t, db, 16)
	err := schema.Up(t.Context(), db)
	if !errors.Is(err, schema.ErrOldSchema) {
		t.Fatalf("Up on a database at 16 with the demo tables: %v, want ErrOldSchema", err)
	}
	for _, want := range []string{"stopped at version 16", "git checkout 22b767d", "bin/retrysafe migrate"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	var version int64
	if err := db.QueryRowContext(t.Context(), `SELECT max(version_id) FROM goose_db_version`).Scan(&version); err != nil || version != 16 {
		t.Errorf("library version after the refusal: %d, %v; want 16, untouched", version, err)
	}
	if slices.Contains(tableNames(t, db), schema.VersionTable) {
		t.Error("the refusal created the demo version table")
	}
}

// upUnsplit applies the single sequence up to version to (all of it when 0).
func upUnsplit(t *testing.T, db *sql.DB, to int64) {
	t.Helper()
	p, err := goose.NewProvider(goose.DialectPostgres, db, unsplitFS(t))
	if err != nil {
		t.Fatal(err)
	}
	if to == 0 {
		_, err = p.Up(t.Context())
	} else {
		_, err = p.UpTo(t.Context(), to)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// catalogQuery describes every object of the current schema, one sorted line each, without the schema's name
// and without the records of applied migrations.
const catalogQuery = `
WITH rels AS (
    SELECT c.oid, c.relname FROM pg_class c
    WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
      AND c.relname NOT IN ('goose_db_version', $1)
)
SELECT line FROM (
    SELECT 'column ' || r.relname || ' ' || row_number() OVER (PARTITION BY r.oid ORDER BY a.attnum) || ' ' || a.attname
           || ' ' || format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
           || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '') AS line
    FROM rels r JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_attrdef d ON d.adrelid = r.oid AND d.adnum = a.attnum
    UNION ALL
    SELECT 'table ' || r.relname || ' options ' || coalesce(array_to_string(c.reloptions, ','), '')
    FROM rels r JOIN pg_class c ON c.oid = r.oid
    UNION ALL
    SELECT 'constraint ' || r.relname || ' ' || c.conname || ' ' || pg_get_constraintdef(c.oid)
    FROM rels r JOIN pg_constraint c ON c.conrelid = r.oid
    UNION ALL
    SELECT 'index ' || r.relname || ' ' || pg_get_indexdef(i.indexrelid)
    FROM rels r JOIN pg_index i ON i.indrelid = r.oid
    UNION ALL
    SELECT 'trigger ' || r.relname || ' ' || pg_get_triggerdef(g.oid)
    FROM rels r JOIN pg_trigger g ON g.tgrelid = r.oid AND NOT g.tgisinternal
    UNION ALL
    SELECT 'function ' || pg_get_functiondef(p.oid)
    FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace
    UNION ALL
    SELECT 'sequence ' || c.relname || ' owned by ' || coalesce(r.relname || '.' || a.attname, 'nothing')
    FROM pg_class c
    LEFT JOIN pg_depend d ON d.objid = c.oid AND d.deptype IN ('a', 'i') AND d.refobjsubid > 0
    LEFT JOIN pg_class r ON r.oid = d.refobjid
    LEFT JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
    WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'S'
      AND coalesce(r.relname, '') NOT IN ('goose_db_version', $1)
) lines
ORDER BY line`

func catalog(t *testing.T, db *sql.DB) []string {
	t.Helper()
	var prefix string
	if err := db.QueryRowContext(t.Context(), `SELECT quote_ident(current_schema()) || '.'`).Scan(&prefix); err != nil {
		t.Fatal(err)
	}
	rows, err := db.QueryContext(t.Context(), catalogQuery, schema.VersionTable)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, strings.ReplaceAll(line, prefix, ""))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(lines)
	return lines
}

func tableNames(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), `SELECT tablename FROM pg_tables WHERE schemaname = current_schema()`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	return names
}

func open(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { db.Close() })
	return db
}

func mustExec(t *testing.T, db *sql.DB, query string) {
	t.Helper()
	if _, err := db.ExecContext(t.Context(), query); err != nil {
		t.Fatal(err)
	}
}

// A refund settled duplicate_effect_confirmed before migration 6 was left pending, its intent's refunded total
// without it. Migration 6 books it from the provider lookup its settlement rests on: succeeded, two executions,
// both in the intent's refunded total; a pending refund that is no duplicate stays as it was.
func TestDuplicatedRefundBookedByMigration(t *testing.T) {
	t.Parallel()
	db := open(t, testdb.EmptySchema(t))
	if err := migrations.Up(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS("."), goose.WithTableName(schema.VersionTable))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(t.Context(), 5); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO operations (id, account_id, kind, state) VALUES
 ('op_dup', 'acct', 'payments.refund', 'duplicate_effect_confirmed'), ('op_run', 'acct', 'payments.refund', 'unknown')`,
		`INSERT INTO operation_events (operation_id, account_id, type, actor, detail) VALUES
 ('op_dup', 'acct', 'provider_lookup', 'test', '{"found":false}'),
 ('op_dup', 'acct', 'provider_lookup', 'test', '{"found":true,"effects":["ref_1","ref_2"]}')`,
		`INSERT INTO payment_intents (id, account_id, order_id, currency, amount_minor, status, captured_minor, refunded_minor, create_operation_id)
 VALUES ('pi_1', 'acct', 'o', 'USD', 1000, 'succeeded', 1000, 100, 'op_create')`,
		`INSERT INTO payment_refunds (id, account_id, intent_id, currency, amount_minor, status, operation_id) VALUES
 ('re_dup', 'acct', 'pi_1', 'USD', 300, 'pending', 'op_dup'), ('re_run', 'acct', 'pi_1', 'USD', 200, 'pending', 'op_run')`,
	} {
		mustExec(t, db, q)
	}
	if err := schema.Up(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	var status, providerID string
	var executions, refunded int64
	if err := db.QueryRowContext(t.Context(), `SELECT r.status, r.executions, r.provider_refund_id, i.refunded_minor
FROM payment_refunds r JOIN payment_intents i ON i.id = r.intent_id WHERE r.id = 're_dup'`).Scan(&status, &executions, &providerID, &refunded); err != nil {
		t.Fatal(err)
	}
	if status != "succeeded" || executions != 2 || providerID != "ref_1" || refunded != 700 {
		t.Errorf("duplicated refund after the migration: %s, %d executions, %s, intent refunded %d; want succeeded, 2, ref_1, 700",
			status, executions, providerID, refunded)
	}
	if err := db.QueryRowContext(t.Context(), `SELECT status, executions FROM payment_refunds WHERE id = 're_run'`).Scan(&status, &executions); err != nil ||
		status != "pending" || executions != 1 {
		t.Errorf("the refund that is no duplicate: %s, %d executions (%v); want pending, 1", status, executions, err)
	}
}
