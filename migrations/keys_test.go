package migrations_test

import (
	"context"
	"testing"
)

// TestKeysMoveIntoOperations upgrades a database that holds keys in idempotency_keys (version 18) to keys held by
// their operations (00019), and back: a completed key keeps its stored response and expiries on its operation, a
// running one stays running, an operation whose claim was released holds no key, and two operations started
// under one key still do not both hold it.
func TestKeysMoveIntoOperations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, sqlDB := emptySchema(t, 1)
	p := provider(t, sqlDB)
	if _, err := p.UpTo(ctx, 18); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string) {
		t.Helper()
		if err := db.Exec(sql).Error; err != nil {
			t.Fatalf("%v\n%s", err, sql)
		}
	}
	exec(`INSERT INTO operations (id, account_id, kind, state, idempotency_key, fingerprint) VALUES
    ('op_done', 'acct', 'tickets.create', 'succeeded', 'k1', 'fp1'),
    ('op_released', 'acct', 'payments.capture', 'cancelled', 'k2', 'fp2'),
    ('op_retried', 'acct', 'payments.capture', 'running', 'k2', 'fp2')`)
	exec(`INSERT INTO idempotency_keys (account_id, idempotency_key, fingerprint, operation_id, state, response_status,
    response_headers, response_body, completed_at, response_expires_at, key_expires_at) VALUES
    ('acct', 'k1', 'fp1', 'op_done', 'completed', 201, '{"Location": ["/v1/tickets/t1"]}', '{"id":"t1"}', now(),
     now() + interval '72 hours', now() + interval '90 days'),
    ('acct', 'k2', 'fp2', 'op_retried', 'running', NULL, NULL, NULL, NULL, NULL, NULL)`)
	if _, err := p.UpByOne(ctx); err != nil {
		t.Fatal(err)
	}
	type held struct {
		ID             string
		KeyState       *string
		ResponseStatus *int
		ResponseBody   []byte
		KeyExpiresAt   *string
	}
	var rows []held
	if err := db.Raw(`SELECT id, key_state, response_status, response_body, key_expires_at::text FROM operations ORDER BY id`).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[0].ID != "op_done" || rows[0].KeyState == nil || *rows[0].KeyState != "completed" ||
		rows[0].ResponseStatus == nil || *rows[0].ResponseStatus != 201 || string(rows[0].ResponseBody) != `{"id":"t1"}` || rows[0].KeyExpiresAt == nil ||
		rows[1].ID != "op_released" || rows[1].KeyState != nil ||
		rows[2].ID != "op_retried" || rows[2].KeyState == nil || *rows[2].KeyState != "running" {
		t.Fatalf("operations after 00019: %+v", rows)
	}
	// The released operation does not hold k2, the retried one does: a third claim of k2 is refused.
	err := db.Exec(`INSERT INTO operations (id, account_id, kind, state, idempotency_key, fingerprint, key_state)
VALUES ('op_third', 'acct', 'payments.capture', 'running', 'k2', 'fp2', 'running')`).Error
	if err == nil {
		t.Fatal("a second holder of k2 was inserted")
	}
	if _, err := p.Down(ctx); err != nil {
		t.Fatal(err)
	}
	var keys []struct{ IdempotencyKey, OperationID, State string }
	if err := db.Raw(`SELECT idempotency_key, operation_id, state FROM idempotency_keys ORDER BY idempotency_key`).Scan(&keys).Error; err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0].OperationID != "op_done" || keys[0].State != "completed" || keys[1].OperationID != "op_retried" || keys[1].State != "running" {
		t.Fatalf("idempotency_keys after 00019's down: %+v", keys)
	}
}
