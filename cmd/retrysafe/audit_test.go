package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/poll"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

// TestAuditVerifyCommand drives `retrysafe audit verify` after real traffic: intact, then broken by an edit
// made with triggers off, with the exit codes an auditor's script relies on.
func TestAuditVerifyCommand(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	addr := proctest.FreeAddr(t)
	seed := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	vars := map[string]string{"DATABASE_URL": db.DSN, "TICKETS_ADDR": addr, "API_KEYS": "acct_e2e:agent:" + testSecret,
		"API_KEY_ID_SECRET": testIDSecret, "AUDIT_SIGNING_KEY": seed, "AUDIT_SEAL_INTERVAL": "100ms"}
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve", "tickets"}, env(vars), &syncWriter{w: &out}) }()
	waitHealthy(t, "http://"+addr+"/readyz", done)
	c := apitest.New(t, "http://"+addr, testSecret)
	c.Post("/v1/tickets", `{"project":"ops","title":"audited"}`, apitest.Key("a1")).Status(t, http.StatusCreated)
	c.Post("/v1/tickets", `{"project":"ops","title":"audited"}`, apitest.Key("a1")).Status(t, http.StatusCreated)
	c.Post("/v1/tickets", `{"project":"ops","title":"other"}`, apitest.Key("a1")).Status(t, http.StatusUnprocessableEntity)
	// The sequencer seals the records within a few intervals (other transactions on the server may hold it back).
	poll.Until(t, "the sequencer seals the records", func() bool {
		n, _, err := audit.Pending(context.Background(), db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	cancel()
	<-done

	signer, _ := auditchain.ParseSigningKey(seed)
	verify := func(args ...string) (int, string) {
		return run2(t, db.DSN, append([]string{"audit", "verify"}, args...)...)
	}
	if code, text := verify("--public-key", signer.PublicKey()); code != 0 || !strings.Contains(text, "INTACT") || !strings.Contains(text, "of 1 operations and approvals") ||
		!strings.Contains(text, "0 not sealed yet") {
		t.Fatalf("exit %d:\n%s", code, text)
	}
	var pk bytes.Buffer
	if err := run(context.Background(), []string{"audit", "public-key"}, env(vars), &pk); err != nil || strings.TrimSpace(pk.String()) != signer.PublicKey() {
		t.Fatalf("public-key: %v %q", err, pk.String())
	}
	if code, _ := verify("--since", "yesterday"); code != 2 {
		t.Fatalf("a bad --since is exit 2, got %d", code)
	}
	if code, text := verify(); code != 0 || !strings.Contains(text, "signatures: not checked") {
		t.Fatalf("without a key: exit %d\n%s", code, text)
	}

	var opID string
	if err := db.Raw(`SELECT id FROM operations`).Scan(&opID).Error; err != nil {
		t.Fatal(err)
	}
	code, text := run2(t, db.DSN, "audit", "timeline", opID)
	if code != 0 || !strings.Contains(text, "records: INTACT") || !strings.Contains(text, "replayed") ||
		!strings.Contains(text, "conflict_rejected") || !strings.Contains(text, "TIME  ") {
		t.Fatalf("timeline: exit %d\n%s", code, text)
	}
	t.Logf("timeline:\n%s", text)

	// A record left unsealed for longer than 10 intervals (no sequencer runs any more): sealing stalled.
	if err := db.Exec(`INSERT INTO operation_events (operation_id, account_id, type, actor, created_at)
SELECT id, account_id, 'observed', 'system:test', now() - interval '1 hour' FROM operations`).Error; err != nil {
		t.Fatal(err)
	}
	if code, text := verify(); code != 1 || !strings.Contains(text, "STALLED") || !strings.Contains(text, "1 not sealed yet") ||
		strings.Contains(text, "BROKEN") {
		t.Fatalf("a record unsealed for an hour: exit %d\n%s", code, text)
	}

	db.Tampered()
	err := db.Exec(`ALTER TABLE operation_events DISABLE TRIGGER USER`).Error
	if err == nil {
		err = db.Exec(`UPDATE operation_events SET detail = '{"status":200}' WHERE type = 'completed'`).Error
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(`ALTER TABLE operation_events ENABLE TRIGGER USER`).Error; err != nil {
		t.Fatal(err)
	}
	code, text = verify("--public-key", signer.PublicKey())
	if code != 1 || !strings.Contains(text, "BROKEN changed: op_") {
		t.Fatalf("after an edit: exit %d\n%s", code, text)
	}
	rep, err := audit.Verify(context.Background(), db.Pool, audit.VerifyOptions{})
	if err != nil || rep.Intact() {
		t.Fatalf("%v %v", rep, err)
	}
	if code, text := run2(t, db.DSN, "audit", "timeline", opID); code != 1 || !strings.Contains(text, "records: BROKEN") {
		t.Fatalf("timeline of a broken chain: exit %d\n%s", code, text)
	}
	if code, _ := run2(t, db.DSN, "audit", "verify", "--operation", "op_missing"); code != 2 {
		t.Fatalf("an unknown operation could not be checked: exit 2, got %d", code)
	}
}

func run2(t *testing.T, dsn string, args ...string) (int, string) {
	t.Helper()
	var buf bytes.Buffer
	err := run(context.Background(), args, env(map[string]string{"DATABASE_URL": dsn}), &buf)
	if err != nil {
		return exitCode(err), buf.String()
	}
	return 0, buf.String()
}
