package migrations_test

import (
	"context"
	"testing"
)

// TestLineageUniqueOverOldRepeats: a database written before 00021 may hold two successors of one operation and
// two records of one attempt id (records are never changed). 00021 still applies, and from then on the database
// refuses a repeat of either; a record that is not an attempt record may name an attempt id again.
func TestLineageUniqueOverOldRepeats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, sqlDB := emptySchema(t, 1)
	p := provider(t, sqlDB)
	if _, err := p.UpTo(ctx, 20); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string) error { return db.Exec(sql).Error }
	must := func(sql string) {
		t.Helper()
		if err := exec(sql); err != nil {
			t.Fatalf("%v\n%s", err, sql)
		}
	}
	must(`INSERT INTO operations (id, account_id, kind, state) VALUES ('op_old', 'acct', 'test.note', 'succeeded'),
    ('op_new', 'acct', 'test.note', 'succeeded')`)
	must(`INSERT INTO operation_events (operation_id, account_id, type, actor, detail) VALUES
    ('op_old', 'acct', 'superseded', 'agent', '{"superseded_by": "op_a"}'),
    ('op_old', 'acct', 'superseded', 'agent', '{"superseded_by": "op_b"}'),
    ('op_old', 'acct', 'replayed', 'agent', '{"attempt_id": "att_1", "outcome": "replayed"}'),
    ('op_old', 'acct', 'replayed', 'agent', '{"attempt_id": "att_1", "outcome": "replayed"}')`)
	if _, err := p.UpByOne(ctx); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`INSERT INTO operation_events (operation_id, account_id, type, actor, detail) VALUES
    ('op_new', 'acct', 'superseded', 'agent', '{}'), ('op_new', 'acct', 'superseded', 'agent', '{}')`,
		`INSERT INTO operation_events (operation_id, account_id, type, actor, detail) VALUES
    ('op_new', 'acct', 'replayed', 'agent', '{"attempt_id": "att_2", "outcome": "replayed"}'),
    ('op_new', 'acct', 'retried', 'agent', '{"attempt_id": "att_2", "outcome": "in_progress"}')`,
	} {
		if err := exec(sql); err == nil {
			t.Errorf("a repeat was written after 00021:\n%s", sql)
		}
	}
	must(`INSERT INTO operation_events (operation_id, account_id, type, actor, detail) VALUES
    ('op_new', 'acct', 'superseded', 'agent', '{}'),
    ('op_new', 'acct', 'claimed', 'agent', '{"attempt_id": "att_2"}'),
    ('op_new', 'acct', 'completed', 'agent', '{"attempt_id": "att_2", "outcome": "created"}'),
    ('op_old', 'acct', 'replayed', 'agent', '{"attempt_id": "att_3", "outcome": "replayed"}')`)
	if _, err := p.Down(ctx); err != nil {
		t.Fatal(err)
	}
	must(`INSERT INTO operation_events (operation_id, account_id, type, actor, detail) VALUES
    ('op_new', 'acct', 'superseded', 'agent', '{}')`)
}
