package auditchain_test

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

func buildChain(t *testing.T, name string, n int) []auditchain.Record {
	t.Helper()
	c := &auditchain.Chain{Name: name}
	var recs []auditchain.Record
	for i := range n {
		r, err := c.Append(map[string]any{"type": fmt.Sprintf("event%d", i), "actor": "agent:a", "detail": map[string]any{"n": i}})
		if err != nil {
			t.Fatal(err)
		}
		r.Ref = fmt.Sprintf("row %d", i+1)
		recs = append(recs, r)
	}
	return recs
}

func verify(t *testing.T, cps []auditchain.Checkpoint, pub ed25519.PublicKey, chains map[string][]auditchain.Record) []auditchain.Problem {
	t.Helper()
	want, p := auditchain.VerifyCheckpoints(cps, pub)
	if p != nil {
		return []auditchain.Problem{*p}
	}
	var v auditchain.Verifier
	for _, e := range want {
		v.Expect(e)
	}
	names := make([]string, 0, len(chains))
	for n := range chains {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		v.Chain(n, chains[n])
	}
	v.Finish(nil)
	return v.Problems
}

func heads(chains map[string][]auditchain.Record) []auditchain.Head {
	var hs []auditchain.Head
	for n, recs := range chains {
		last := recs[len(recs)-1]
		hs = append(hs, auditchain.Head{Chain: n, Seq: last.Seq, Hash: last.Hash})
	}
	return hs
}

func TestTampering(t *testing.T) {
	t.Parallel()
	seed := make([]byte, 32)
	seed[0] = 7
	signer, err := auditchain.ParseSigningKey(base64.StdEncoding.EncodeToString(seed))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := auditchain.ParsePublicKey(signer.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	fresh := func() (map[string][]auditchain.Record, []auditchain.Checkpoint) {
		chains := map[string][]auditchain.Record{"op_a": buildChain(t, "op_a", 5), "op_b": buildChain(t, "op_b", 3)}
		cp, err := auditchain.NextCheckpoint(nil, time.Now(), heads(chains), signer)
		if err != nil {
			t.Fatal(err)
		}
		return chains, []auditchain.Checkpoint{cp}
	}
	chains, cps := fresh()
	if ps := verify(t, cps, pub, chains); len(ps) != 0 {
		t.Fatalf("intact chains: %v", ps)
	}

	tests := []struct {
		name   string
		tamper func(chains map[string][]auditchain.Record, cps []auditchain.Checkpoint) []auditchain.Checkpoint
		kind   auditchain.Kind
		seq    int64
	}{
		{"field changed", func(c map[string][]auditchain.Record, cps []auditchain.Checkpoint) []auditchain.Checkpoint {
			c["op_a"][2].Body = json.RawMessage(`{"type":"event2","actor":"agent:mallory","detail":{"n":2}}`)
			return cps
		}, auditchain.Changed, 3},
		{"middle record deleted", func(c map[string][]auditchain.Record, cps []auditchain.Checkpoint) []auditchain.Checkpoint {
			c["op_a"] = slices.Delete(c["op_a"], 2, 3)
			return cps
		}, auditchain.Missing, 4},
		{"whole chain deleted", func(c map[string][]auditchain.Record, cps []auditchain.Checkpoint) []auditchain.Checkpoint {
			delete(c, "op_b")
			return cps
		}, auditchain.Missing, 3},
		{"two records swapped", func(c map[string][]auditchain.Record, cps []auditchain.Checkpoint) []auditchain.Checkpoint {
			c["op_a"][1], c["op_a"][2] = c["op_a"][2], c["op_a"][1]
			return cps
		}, auditchain.OutOfOrder, 3},
		{"tail truncated", func(c map[string][]auditchain.Record, cps []auditchain.Checkpoint) []auditchain.Checkpoint {
			c["op_a"] = c["op_a"][:3]
			return cps
		}, auditchain.Missing, 5},
		{"record inserted", func(c map[string][]auditchain.Record, cps []auditchain.Checkpoint) []auditchain.Checkpoint {
			extra := c["op_a"][1]
			extra.Body = json.RawMessage(`{"type":"forged"}`)
			extra.Hash, _ = extra.Compute()
			c["op_a"] = slices.Insert(c["op_a"], 2, extra)
			return cps
		}, auditchain.Inserted, 2},
		{"record rewritten with its own hash recomputed", func(c map[string][]auditchain.Record, cps []auditchain.Checkpoint) []auditchain.Checkpoint {
			c["op_a"][1].Body = json.RawMessage(`{"type":"forged"}`)
			c["op_a"][1].Hash, _ = c["op_a"][1].Compute()
			return cps
		}, auditchain.Changed, 2},
		{"chain recomputed, checkpoint left", func(c map[string][]auditchain.Record, cps []auditchain.Checkpoint) []auditchain.Checkpoint {
			c["op_a"] = recompute(t, "op_a", c["op_a"], 1)
			return cps
		}, auditchain.CheckpointMismatch, 5},
		{"chain and checkpoint recomputed without the key", func(c map[string][]auditchain.Record, cps []auditchain.Checkpoint) []auditchain.Checkpoint {
			c["op_a"] = recompute(t, "op_a", c["op_a"], 1)
			forged, err := auditchain.NextCheckpoint(nil, cps[0].At, heads(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			forged.Signature = cps[0].Signature
			return []auditchain.Checkpoint{forged}
		}, auditchain.BadSignature, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chains, cps := fresh()
			cps = tt.tamper(chains, cps)
			ps := verify(t, cps, pub, chains)
			if len(ps) != 1 || ps[0].Kind != tt.kind || ps[0].Seq != tt.seq {
				t.Fatalf("want one %s at seq %d, got %v", tt.kind, tt.seq, ps)
			}
		})
	}

	t.Run("forgery passes without a public key", func(t *testing.T) {
		chains, cps := fresh()
		chains["op_a"] = recompute(t, "op_a", chains["op_a"], 1)
		forged, _ := auditchain.NextCheckpoint(nil, cps[0].At, heads(chains), nil)
		if ps := verify(t, []auditchain.Checkpoint{forged}, nil, chains); len(ps) != 0 {
			t.Fatalf("the format claims nothing against a recomputation without signatures, got %v", ps)
		}
	})
}

// recompute rewrites record idx's body and relinks the rest of the chain, as an attacker with write access would.
func recompute(t *testing.T, name string, recs []auditchain.Record, idx int) []auditchain.Record {
	t.Helper()
	c := &auditchain.Chain{Name: name}
	out := make([]auditchain.Record, len(recs))
	for i, r := range recs {
		body := r.Body
		if i == idx {
			body = json.RawMessage(`{"type":"forged"}`)
		}
		nr, err := c.Append(body)
		if err != nil {
			t.Fatal(err)
		}
		nr.Ref = r.Ref
		out[i] = nr
	}
	return out
}

func TestCheckpointChain(t *testing.T) {
	t.Parallel()
	var cps []auditchain.Checkpoint
	var prev *auditchain.Checkpoint
	for i := range 3 {
		cp, err := auditchain.NextCheckpoint(prev, time.Now(), []auditchain.Head{{Chain: fmt.Sprintf("op_%d", i), Seq: 1, Hash: auditchain.Genesis}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		cps = append(cps, cp)
		prev = &cps[len(cps)-1]
	}
	if _, p := auditchain.VerifyCheckpoints(cps, nil); p != nil {
		t.Fatalf("intact: %v", p)
	}
	if _, p := auditchain.VerifyCheckpoints([]auditchain.Checkpoint{cps[0], cps[2]}, nil); p == nil || p.Kind != auditchain.Missing {
		t.Fatalf("deleted checkpoint: %v", p)
	}
	changed := slices.Clone(cps)
	changed[1].Heads = []auditchain.Head{{Chain: "op_x", Seq: 1, Hash: auditchain.Genesis}}
	if _, p := auditchain.VerifyCheckpoints(changed, nil); p == nil || p.Kind != auditchain.Changed || p.Seq != 2 {
		t.Fatalf("changed checkpoint: %v", p)
	}
	if _, p := auditchain.VerifyCheckpoints(cps, make(ed25519.PublicKey, ed25519.PublicKeySize)); p == nil || p.Kind != auditchain.BadSignature {
		t.Fatalf("unsigned under a public key: %v", p)
	}
}

func TestCanonicalIsRFC8785(t *testing.T) {
	t.Parallel()
	got, err := auditchain.Canonical(json.RawMessage(`{"b": 1, "a": "<é\u0001>", "c": [true, null, 1e3]}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a":"<é\u0001>","b":1,"c":[true,null,1000]}`; string(got) != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	// The link envelope is canonical JSON too: the same hash whatever way it is built.
	body, _ := auditchain.Canonical(map[string]any{"x": 1})
	env, _ := auditchain.Canonical(map[string]any{"chain": "op<1>", "prev": auditchain.Genesis, "record": json.RawMessage(body), "seq": 1})
	r := auditchain.Record{Chain: "op<1>", Seq: 1, Prev: auditchain.Genesis, Body: json.RawMessage(`{ "x" : 1.0 }`)}
	if h, err := r.Compute(); err != nil || h != sha(env) {
		t.Fatalf("the link hash %s (%v) is not the SHA-256 of %s", h, err, env)
	}
	// Append's record is the body's canonical JSON, whatever the chain's name and the body hold.
	c := auditchain.Resume(auditchain.Head{Chain: `op","prev":"","record":{` + "\u2028", Seq: 999, Hash: auditchain.Genesis})
	content := map[string]any{"z": `,"prev":"x","record":{}`, "a": []any{1.50, `\`}, "seq": 7}
	rec, err := c.Append(content)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := auditchain.Canonical(content)
	if string(rec.Body) != string(want) || rec.Seq != 1000 {
		t.Fatalf("Append's record %s (seq %d); want %s", rec.Body, rec.Seq, want)
	}
	if h, err := rec.Compute(); err != nil || h != rec.Hash {
		t.Fatalf("Append's hash %s is not the record's %s (%v)", rec.Hash, h, err)
	}
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
