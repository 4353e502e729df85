package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
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
		"API_KEY_ID_SECRET": testIDSecret, "AUDIT_SIGNING_KEY": seed, "AUDIT_CHECKPOINT_INTERVAL": "100ms"}
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve", "tickets"}, env(vars), &syncWriter{w: &out}) }()
	waitHealthy(t, "http://"+addr+"/readyz", done)
	c := apitest.New(t, "http://"+addr, testSecret)
	c.Post("/v1/tickets", `{"project":"ops","title":"audited"}`, apitest.Key("a1")).Status(t, http.StatusCreated)
	c.Post("/v1/tickets", `{"project":"ops","title":"audited"}`, apitest.Key("a1")).Status(t, http.StatusCreated)
	c.Post("/v1/tickets", `{"project":"ops","title":"other"}`, apitest.Key("a1")).Status(t, http.StatusUnprocessableEntity)
	// The worker seals the chains within a few intervals.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int64
		db.Raw(`SELECT count(*) FROM audit_chain_heads WHERE NOT checkpointed`).Scan(&n)
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the checkpoint worker did not seal the chains")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	<-done

	signer, _ := auditchain.ParseSigningKey(seed)
	verify := func(args ...string) (int, string) {
		return run2(t, db.DSN, append([]string{"audit", "verify"}, args...)...)
	}
	if code, text := verify("--public-key", signer.PublicKey()); code != 0 || !strings.Contains(text, "INTACT") || !strings.Contains(text, "checked 1 chains") {
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
	if code != 0 || !strings.Contains(text, "chain: INTACT") || !strings.Contains(text, "replayed") ||
		!strings.Contains(text, "conflict_rejected") || !strings.Contains(text, "TIME  ") {
		t.Fatalf("timeline: exit %d\n%s", code, text)
	}
	t.Logf("timeline:\n%s", text)

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
	rep, err := audit.Verify(context.Background(), db.DB, audit.VerifyOptions{})
	if err != nil || rep.Intact() {
		t.Fatalf("%v %v", rep, err)
	}
	if code, text := run2(t, db.DSN, "audit", "timeline", opID); code != 1 || !strings.Contains(text, "chain: BROKEN") {
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
