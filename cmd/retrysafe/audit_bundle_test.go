package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// noDatabase is a DATABASE_URL nothing listens on: `audit verify --bundle` must not need one.
const noDatabase = "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1"

// TestAuditBundle exports the audit record with `retrysafe audit export`, checks the bundle with `audit verify
// --bundle` and no database (exit 0), then tampers with it in each way an auditor must catch (exit 1), and pins
// the newest checkpoint with --checkpoint.
func TestAuditBundle(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	ctx := context.Background()
	seed := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	signer, _ := auditchain.ParseSigningKey(seed)
	var ops []string
	for i := range 3 {
		id := opstatus.NewID()
		err := db.Exec(`WITH op AS (
    INSERT INTO operations (id, account_id, kind, state, idempotency_key, fingerprint) VALUES (?, 'acct_a', 'tickets.create', 'running', ?, 'sha256:abc') RETURNING id, account_id, state
)
INSERT INTO operation_events (operation_id, account_id, type, to_state, actor) SELECT id, account_id, 'claimed', state, 'agent:a' FROM op`,
			id, fmt.Sprintf("key-%d", i)).Error
		if err != nil {
			t.Fatal(err)
		}
		if err := opstatus.Append(ctx, db.DB, "acct_a", id, opstatus.EventReplayed, "agent:a", map[string]any{"status": 201}); err != nil {
			t.Fatal(err)
		}
		if _, err := opstatus.Transition(ctx, db.DB, "acct_a", id, opstatus.StateSucceeded, "agent:a"); err != nil {
			t.Fatal(err)
		}
		ops = append(ops, id)
	}
	w := &audit.CheckpointWorker{DB: db.DB, Signer: signer}
	if cp, err := w.RunOnce(ctx); err != nil || cp == nil {
		t.Fatalf("checkpoint: %v %v", cp, err)
	}
	if err := opstatus.Append(ctx, db.DB, "acct_a", ops[1], "observed", "system:test", nil); err != nil {
		t.Fatal(err)
	}
	last, err := w.RunOnce(ctx)
	if err != nil || last == nil {
		t.Fatalf("checkpoint: %v %v", last, err)
	}

	var out bytes.Buffer
	err = run(ctx, []string{"audit", "export"}, env(map[string]string{"DATABASE_URL": db.DSN, "AUDIT_SIGNING_KEY": seed}), &out)
	if err != nil {
		t.Fatalf("export: %v\n%s", err, out.String())
	}
	exported := out.Bytes()
	dir := t.TempDir()
	verify := func(bundle []byte, args ...string) (int, string) {
		t.Helper()
		path := filepath.Join(dir, "bundle.json")
		if err := os.WriteFile(path, bundle, 0o600); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		err := run(ctx, append([]string{"audit", "verify", "--bundle", path}, args...), env(map[string]string{"DATABASE_URL": noDatabase}), &buf)
		if err != nil {
			return exitCode(err), buf.String() + err.Error()
		}
		return 0, buf.String()
	}
	code, text := verify(exported)
	if code != 0 || !strings.Contains(text, "INTACT") || !strings.Contains(text, "checked 3 chains (operations and approvals), 10 records, 2 checkpoints") ||
		!strings.Contains(text, "the bundle's own public key") || !strings.Contains(text, ": the whole record, exported at") {
		t.Fatalf("intact bundle: exit %d\n%s", code, text)
	}
	if code, text := verify(exported, "--checkpoint", last.Hash, "--public-key", signer.PublicKey()); code != 0 || !strings.Contains(text, "checked with --public-key") {
		t.Fatalf("intact bundle, pinned to the newest checkpoint: exit %d\n%s", code, text)
	}

	// Each case edits a fresh copy of the bundle as JSON.
	type doc = map[string]any
	chain := func(d doc, name string) doc {
		for _, c := range d["chains"].([]any) {
			if c.(doc)["chain"] == name {
				return c.(doc)
			}
		}
		t.Fatalf("no chain %s in the bundle", name)
		return nil
	}
	records := func(d doc, name string) []any { return chain(d, name)["records"].([]any) }
	// dropNewest removes ops[1]'s newest record and moves its head in the bundle's head list back to match.
	dropNewest := func(d doc) {
		c := chain(d, ops[1])
		recs := c["records"].([]any)
		c["records"] = recs[:len(recs)-1]
		tail := recs[len(recs)-2].(doc)
		for _, h := range d["heads"].([]any) {
			if h.(doc)["chain"] == ops[1] {
				h.(doc)["seq"], h.(doc)["hash"] = tail["seq"], tail["hash"]
			}
		}
	}
	// forgeNewestCheckpoint rewrites the newest checkpoint to seal ops[1] without its newest record, recomputing
	// its hash; with attacker set, every checkpoint is re-signed with another key, which replaces the bundle's.
	forgeNewestCheckpoint := func(d doc, attacker *auditchain.Signer) {
		dropNewest(d)
		tail := records(d, ops[1])[2].(doc)
		cps := d["checkpoints"].([]any)
		raw := cps[len(cps)-1].(doc)
		at, _ := time.Parse(time.RFC3339Nano, raw["created_at"].(string))
		cp := auditchain.Checkpoint{Seq: int64(raw["seq"].(float64)), Prev: raw["prev_hash"].(string), At: at,
			Heads: []auditchain.Head{{Chain: ops[1], Seq: int64(tail["seq"].(float64)), Hash: tail["hash"].(string)}}}
		h, err := cp.Compute()
		if err != nil {
			t.Fatal(err)
		}
		raw["heads"], raw["hash"] = cp.Heads, h
		if attacker != nil {
			for _, c := range cps {
				c.(doc)["signature"] = attacker.Sign(c.(doc)["hash"].(string))
			}
			d["public_key"] = attacker.PublicKey()
		}
	}
	attacker, _ := auditchain.ParseSigningKey(base64.StdEncoding.EncodeToString([]byte("attacker-key-0123456789abcdef012")))
	cases := []struct {
		name   string
		edit   func(d doc)
		args   []string
		code   int
		broken string
	}{
		{"a changed field", func(d doc) { records(d, ops[0])[1].(doc)["record"].(doc)["actor"] = "agent:mallory" }, nil, 1, "BROKEN changed: " + ops[0] + " seq 2"},
		{"a deleted record", func(d doc) {
			c := chain(d, ops[0])
			c["records"] = slices.Delete(c["records"].([]any), 1, 2)
		}, nil, 1, "BROKEN missing: " + ops[0] + " seq 3"},
		{"a deleted operation", func(d doc) {
			d["chains"] = slices.DeleteFunc(d["chains"].([]any), func(c any) bool { return c.(doc)["chain"] == ops[2] })
		}, nil, 1, "BROKEN missing: " + ops[2]},
		{"reordered records", func(d doc) {
			recs := records(d, ops[0])
			recs[0], recs[1] = recs[1], recs[0]
		}, nil, 1, "BROKEN out of order: " + ops[0]},
		{"deleted newest records", dropNewest, nil, 1, "BROKEN missing: " + ops[1] + " seq 4"},
		{"a forged checkpoint", func(d doc) { forgeNewestCheckpoint(d, nil) }, nil, 1, "BROKEN bad signature: (checkpoints) seq 2"},
		// Re-signed with the forger's key, which the bundle then carries: only a key or a checkpoint hash kept
		// apart from the bundle catches it.
		{"a forged, re-signed checkpoint, checked with the bundle's key", func(d doc) { forgeNewestCheckpoint(d, attacker) }, nil, 0, ""},
		{"a forged, re-signed checkpoint, checked with the operator's key", func(d doc) { forgeNewestCheckpoint(d, attacker) },
			[]string{"--public-key", signer.PublicKey()}, 1, "BROKEN bad signature: (checkpoints) seq 1"},
		{"a forged, re-signed checkpoint, pinned", func(d doc) { forgeNewestCheckpoint(d, attacker) },
			[]string{"--checkpoint", last.Hash}, 1, "BROKEN missing: (checkpoints) seq 0: the pinned checkpoint " + last.Hash},
		// Checkpoints are never deleted: a whole record starts at the first.
		{"the oldest checkpoint deleted, with an operation only it sealed", func(d doc) {
			d["checkpoints"] = d["checkpoints"].([]any)[1:]
			d["chains"] = slices.DeleteFunc(d["chains"].([]any), func(c any) bool { return c.(doc)["chain"] == ops[2] })
			d["heads"] = slices.DeleteFunc(d["heads"].([]any), func(h any) bool { return h.(doc)["chain"] == ops[2] })
		}, nil, 1, "BROKEN missing: (checkpoints) seq 2"},
		{"the newest checkpoint deleted", func(d doc) {
			cps := d["checkpoints"].([]any)
			d["checkpoints"] = cps[:len(cps)-1]
		}, nil, 0, ""},
		{"the newest checkpoint deleted, pinned", func(d doc) {
			cps := d["checkpoints"].([]any)
			d["checkpoints"] = cps[:len(cps)-1]
		}, []string{"--checkpoint", last.Hash}, 1, "BROKEN missing: (checkpoints)"},
	}
	for _, tc := range cases {
		var d doc
		if err := json.Unmarshal(exported, &d); err != nil {
			t.Fatal(err)
		}
		tc.edit(d)
		edited, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		code, text := verify(edited, tc.args...)
		if code != tc.code || (tc.broken != "" && !strings.Contains(text, tc.broken)) || (tc.code == 0 && !strings.Contains(text, "INTACT")) {
			t.Errorf("%s: exit %d, want %d with %q:\n%s", tc.name, code, tc.code, tc.broken, text)
		}
	}

	// What cannot be checked is exit 2.
	if code, text := verify([]byte(`{"format":"something else"}`)); code != 2 {
		t.Errorf("not a bundle: exit %d\n%s", code, text)
	}
	if code, _ := run2(t, noDatabase, "audit", "verify", "--bundle", filepath.Join(dir, "absent.json")); code != 2 {
		t.Errorf("no such file: exit %d", code)
	}
	if code, _ := run2(t, noDatabase, "audit", "verify", "--bundle", "b.json", "--operation", ops[0]); code != 2 {
		t.Errorf("--bundle with --operation: exit %d", code)
	}
	if code, _ := run2(t, db.DSN, "audit", "export", "--operation", ops[0], "--since", "2026-01-01T00:00:00Z"); code != 2 {
		t.Errorf("export --operation with --since: exit %d", code)
	}
	if code, text := run2(t, db.DSN, "audit", "export", "--operation", "op_missing"); code != 2 || strings.Contains(text, "format") {
		t.Errorf("export of an unknown operation: exit %d\n%s", code, text)
	}
}
