package migrations_test

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/migrations"
	"github.com/retrysafe/retrysafe/services/schema"
)

// libraryLocal and demoLocal are the tables that are not distributed by account_id, and why (docs/sharding.md):
// the library's, which migrations.Up creates, and the demo services', which services/schema adds.
// Every other table must have an account_id column that leads its primary key, its unique constraints and
// indexes and its foreign keys (on both sides).
var (
	libraryLocal = map[string]string{
		"goose_db_version": "goose's record of the applied migrations",
		"audit_seals":      "one chain of seals over every account's records, written by one sequencer at a time",
		"console_sessions": "found by the hash of the session cookie, before the account is known",
	}
	demoLocal = map[string]string{
		schema.VersionTable:         "goose's record of the demo services' applied migrations",
		"deploy_target_activations": "the simulated deploy target: stands for a remote system, not our data",
		"payment_provider_sweep":    "one row for the whole database: the timeline it is on and how far the payments sweep matched",
		"deploy_target_fences":      "the simulated deploy target: stands for a remote system, not our data",
	}
)

// libraryTables is every table migrations.Up creates: an adopter's database gets these and nothing else.
var libraryTables = []string{
	"approval_events", "approvals", "audit_seals", "console_sessions", "goose_db_version", "grant_events", "grants",
	"operation_events", "operations",
}

// TestShardKeys reads the catalog of a schema with every migration applied, the library's and the demo services', and fails, naming the table and the
// constraint, on any key of a tenant table that does not lead with account_id; and on a table without
// account_id that is not one of libraryLocal and demoLocal.
func TestShardKeys(t *testing.T) {
	t.Parallel()
	tx := testdb.Tx(t)
	localTables := maps.Clone(libraryLocal)
	maps.Copy(localTables, demoLocal)
	problems, tenant := shardProblems(t, tx, localTables)
	for _, p := range problems {
		t.Error(p)
	}
	for name := range localTables {
		var n int64
		tx.Raw(`SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = ?`, name).Scan(&n)
		if n != 1 {
			t.Errorf("localTables lists %s, which the migrations do not create", name)
		}
	}
	if len(tenant) < 10 {
		t.Fatalf("found only %d tenant tables (%v): is the catalog read in the migrated schema?", len(tenant), tenant)
	}

	// docs/sharding.md names one create_distributed_table call for each tenant table, and no other.
	readme, err := os.ReadFile("../docs/sharding.md")
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, m := range regexp.MustCompile(`create_distributed_table\('([a-z_]+)'`).FindAllStringSubmatch(string(readme), -1) {
		documented = append(documented, m[1])
	}
	sort.Strings(documented)
	if strings.Join(documented, " ") != strings.Join(tenant, " ") {
		t.Errorf("docs/sharding.md distributes %v\nthe catalog's tenant tables are %v", documented, tenant)
	}
}

// TestLibraryTablesOnly migrates an empty schema with migrations.Up alone, as a service that uses the library
// does: it gets exactly the library's tables, none of the demo services' (services/schema), and they keep the
// shard rules with only the library's local tables.
func TestLibraryTablesOnly(t *testing.T) {
	t.Parallel()
	db, sqlDB := emptySchema(t, 2)
	if err := migrations.Up(t.Context(), sqlDB); err != nil {
		t.Fatal(err)
	}
	var tables []string
	if err := db.Raw(`SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename`).
		Scan(&tables).Error; err != nil {
		t.Fatal(err)
	}
	if strings.Join(tables, " ") != strings.Join(libraryTables, " ") {
		t.Errorf("migrations.Up created %v\nwant exactly the library's %v", tables, libraryTables)
	}
	for _, demo := range schema.Tables {
		if slices.Contains(tables, demo) {
			t.Errorf("migrations.Up created the demo table %s", demo)
		}
	}
	problems, tenant := shardProblems(t, db, libraryLocal)
	for _, p := range problems {
		t.Error(p)
	}
	for name := range libraryLocal {
		if !slices.Contains(tables, name) {
			t.Errorf("libraryLocal lists %s, which migrations.Up does not create", name)
		}
	}
	if len(tenant) != len(libraryTables)-len(libraryLocal) {
		t.Errorf("tenant tables %v", tenant)
	}
	if pending, err := migrations.Pending(t.Context(), sqlDB); err != nil || pending {
		t.Errorf("Pending after Up: %v, %v", pending, err)
	}
}

// TestShardKeysCatchBadKeys shows the check fails: in a schema of its own, every kind of bad key is reported by
// its constraint's name, and the good ones are not.
func TestShardKeysCatchBadKeys(t *testing.T) {
	t.Parallel()
	db, _ := emptySchema(t, 1)
	err := db.Exec(`
CREATE TABLE good (account_id text, id text, ref text, CONSTRAINT good_pk PRIMARY KEY (account_id, id),
    CONSTRAINT good_ref_key UNIQUE (account_id, ref));
CREATE TABLE bad_pk (id text CONSTRAINT bad_pk_pk PRIMARY KEY, account_id text NOT NULL);
CREATE TABLE bad_unique (account_id text, id text, ref text, CONSTRAINT bad_unique_pk PRIMARY KEY (account_id, id),
    CONSTRAINT bad_unique_ref_key UNIQUE (ref, account_id));
CREATE UNIQUE INDEX bad_unique_index ON bad_unique (ref) WHERE ref IS NOT NULL;
CREATE TABLE bad_fk (account_id text, id text, good_id text, CONSTRAINT bad_fk_pk PRIMARY KEY (account_id, id),
    CONSTRAINT bad_fk_good_fkey FOREIGN KEY (good_id, account_id) REFERENCES good (id, account_id));
CREATE UNIQUE INDEX good_id_account ON good (id, account_id);
-- Leads with account_id, but pairs it with the referenced table's id: the rows of one account could point at
-- another's.
ALTER TABLE bad_fk ADD CONSTRAINT bad_fk_crossed_fkey FOREIGN KEY (account_id, good_id) REFERENCES good (id, account_id);
CREATE TABLE good_fk (account_id text, id text, good_id text, CONSTRAINT good_fk_pk PRIMARY KEY (account_id, id),
    CONSTRAINT good_fk_good_fkey FOREIGN KEY (account_id, good_id) REFERENCES good (account_id, id));
CREATE TABLE no_account (id text CONSTRAINT no_account_pk PRIMARY KEY);
CREATE TABLE listed_local (id text PRIMARY KEY);
`).Error
	if err != nil {
		t.Fatal(err)
	}
	problems, tenant := shardProblems(t, db, map[string]string{"listed_local": "a local table"})
	got := strings.Join(problems, "\n")
	for _, want := range []string{
		"bad_pk: primary key bad_pk_pk (id) does not lead with account_id",
		"bad_unique: unique constraint bad_unique_ref_key (ref, account_id) does not lead with account_id",
		"bad_unique: unique index bad_unique_index (ref) does not lead with account_id",
		"bad_fk: foreign key bad_fk_good_fkey (good_id, account_id) -> good (id, account_id) does not lead with account_id",
		"bad_fk: foreign key bad_fk_crossed_fkey (account_id, good_id) -> good (id, account_id) does not lead with account_id",
		"good: unique index good_id_account (id, account_id) does not lead with account_id",
		"no_account: no account_id column, and not listed as a local table",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the check did not report %q; it reported:\n%s", want, got)
		}
	}
	if len(problems) != 7 {
		t.Errorf("%d problems, want exactly the 7 bad keys:\n%s", len(problems), got)
	}
	if strings.Join(tenant, " ") != "bad_fk bad_pk bad_unique good good_fk" {
		t.Errorf("tenant tables %v", tenant)
	}
}

// shardProblems checks the tables of db's current schema: every one not in local must have account_id, and
// account_id must be the first column of each of its primary keys, unique constraints, unique indexes and
// foreign keys (on the referencing side, and as the referenced column it pairs with). It returns one line per
// problem, naming the table and the constraint, and the names of the tables it treated as tenant tables.
func shardProblems(t *testing.T, db *gorm.DB, local map[string]string) (problems, tenant []string) {
	t.Helper()
	var tables []struct {
		Name       string
		HasAccount bool
	}
	err := db.Raw(`
SELECT c.relname AS name,
       EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'account_id' AND NOT a.attisdropped) AS has_account
FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
ORDER BY c.relname`).Scan(&tables).Error
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if _, ok := local[tb.Name]; ok {
			continue
		}
		if !tb.HasAccount {
			problems = append(problems, tb.Name+": no account_id column, and not listed as a local table")
			continue
		}
		tenant = append(tenant, tb.Name)
	}

	// Each key with its columns in order. For a foreign key, also the referenced columns in order: the
	// referencing account_id must be paired with the referenced table's account_id.
	var keys []struct {
		Table, Kind, Name, Columns string
		// References is, for a foreign key, the referenced table and columns: " -> t (a, b)".
		References     string
		FirstIsAccount bool
	}
	err = db.Raw(`
WITH keys AS (
    SELECT c.conrelid AS rel, CASE c.contype WHEN 'p' THEN 'primary key' WHEN 'u' THEN 'unique constraint'
                             WHEN 'f' THEN 'foreign key' ELSE 'exclusion constraint' END AS kind,
           c.conname AS name, c.conkey AS cols, c.confrelid AS frel, c.confkey AS fcols
    FROM pg_constraint c
    WHERE c.connamespace = current_schema()::regnamespace AND c.contype IN ('p', 'u', 'f', 'x')
    UNION ALL
    -- Unique indexes that back no constraint (partial ones, expressions): a distributed table needs them too.
    -- indkey is an int2vector, numbered from 0; through text it becomes an array numbered from 1 like conkey.
    SELECT i.indrelid, 'unique index', ic.relname, string_to_array(i.indkey::text, ' ')::int2[], 0, NULL
    FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
    WHERE ic.relnamespace = current_schema()::regnamespace AND i.indisunique
      AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid AND c.contype IN ('p', 'u', 'x'))
)
SELECT r.relname AS "table", k.kind, k.name,
       (SELECT string_agg(coalesce(a.attname, 'an expression'), ', ' ORDER BY n.ord)
        FROM unnest(k.cols) WITH ORDINALITY AS n(num, ord)
        LEFT JOIN pg_attribute a ON a.attrelid = k.rel AND a.attnum = n.num) AS columns,
       CASE WHEN k.frel <> 0 THEN ' -> ' || k.frel::regclass::text || ' (' ||
           (SELECT string_agg(a.attname, ', ' ORDER BY n.ord) FROM unnest(k.fcols) WITH ORDINALITY AS n(num, ord)
            JOIN pg_attribute a ON a.attrelid = k.frel AND a.attnum = n.num) || ')' ELSE '' END AS "references",
       coalesce((SELECT a.attname = 'account_id' FROM pg_attribute a WHERE a.attrelid = k.rel AND a.attnum = k.cols[1]), false)
       AND (k.frel = 0 OR coalesce((SELECT a.attname = 'account_id' FROM pg_attribute a
                                    WHERE a.attrelid = k.frel AND a.attnum = k.fcols[1]), false)) AS first_is_account
FROM keys k JOIN pg_class r ON r.oid = k.rel
ORDER BY 1, 3`).Scan(&keys).Error
	if err != nil {
		t.Fatal(err)
	}
	isTenant := map[string]bool{}
	for _, name := range tenant {
		isTenant[name] = true
	}
	for _, k := range keys {
		if isTenant[k.Table] && !k.FirstIsAccount {
			problems = append(problems, k.Table+": "+k.Kind+" "+k.Name+" ("+k.Columns+")"+k.References+" does not lead with account_id")
		}
	}
	return problems, tenant
}
