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

func TestChainTampering(t *testing.T) {
	t.Parallel()
	verify := func(recs []auditchain.Record) []auditchain.Problem {
		var v auditchain.Verifier
		v.Chain("jnl_a", recs)
		return v.Problems
	}
	if ps := verify(buildChain(t, "jnl_a", 5)); len(ps) != 0 {
		t.Fatalf("intact chain: %v", ps)
	}
	tests := []struct {
		name   string
		tamper func(recs []auditchain.Record) []auditchain.Record
		kind   auditchain.Kind
		seq    int64
	}{
		{"field changed", func(c []auditchain.Record) []auditchain.Record {
			c[2].Body = json.RawMessage(`{"type":"event2","actor":"agent:mallory","detail":{"n":2}}`)
			return c
		}, auditchain.Changed, 3},
		{"middle record deleted", func(c []auditchain.Record) []auditchain.Record {
			return slices.Delete(c, 2, 3)
		}, auditchain.Missing, 4},
		{"two records swapped", func(c []auditchain.Record) []auditchain.Record {
			c[1], c[2] = c[2], c[1]
			return c
		}, auditchain.OutOfOrder, 3},
		{"record inserted", func(c []auditchain.Record) []auditchain.Record {
			extra := c[1]
			extra.Body = json.RawMessage(`{"type":"forged"}`)
			extra.Hash, _ = extra.Compute()
			return slices.Insert(c, 2, extra)
		}, auditchain.Inserted, 2},
		{"record rewritten with its own hash recomputed", func(c []auditchain.Record) []auditchain.Record {
			c[1].Body = json.RawMessage(`{"type":"forged"}`)
			c[1].Hash, _ = c[1].Compute()
			return c
		}, auditchain.Changed, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps := verify(tt.tamper(buildChain(t, "jnl_a", 5)))
			if len(ps) != 1 || ps[0].Kind != tt.kind || ps[0].Seq != tt.seq {
				t.Fatalf("want one %s at seq %d, got %v", tt.kind, tt.seq, ps)
			}
		})
	}
}

// seals builds a chain of n seals of two entries each, signed by signer (unsigned when nil).
func seals(t *testing.T, n int, signer *auditchain.Signer) []auditchain.Seal {
	t.Helper()
	var out []auditchain.Seal
	var prev *auditchain.Seal
	for i := range n {
		entries := []auditchain.Entry{
			{Table: "operation_events", ID: int64(2*i + 1), AccountID: "acct_a", Subject: fmt.Sprintf("op_%d", i), Hash: sha([]byte{byte(i)})},
			{Table: "operation_events", ID: int64(2*i + 2), AccountID: "acct_a", Subject: fmt.Sprintf("op_%d", i), Hash: sha([]byte{byte(i), 1})},
		}
		through := map[string]auditchain.Position{"operation_events": {XID: fmt.Sprint(1000 + i), ID: int64(2*i + 2)}}
		s, err := auditchain.NextSeal(prev, time.Now(), entries, through, signer)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
		prev = &out[len(out)-1]
	}
	return out
}

func TestSealChain(t *testing.T) {
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
	attacker, _ := auditchain.ParseSigningKey(base64.StdEncoding.EncodeToString(make([]byte, 32)))
	ss := seals(t, 3, signer)
	if p := auditchain.VerifySealChain(ss, pub); p != nil {
		t.Fatalf("intact: %v", p)
	}
	if ss[1].First != 3 || ss[2].First != 5 || ss[2].Count != 2 {
		t.Fatalf("ordinals: %+v", ss)
	}
	tests := []struct {
		name   string
		tamper func(ss []auditchain.Seal) []auditchain.Seal
		pub    ed25519.PublicKey
		kind   auditchain.Kind
		seq    int64
	}{
		{"a seal deleted from the middle", func(ss []auditchain.Seal) []auditchain.Seal { return slices.Delete(ss, 1, 2) }, pub, auditchain.Missing, 3},
		{"two seals swapped", func(ss []auditchain.Seal) []auditchain.Seal { ss[1], ss[2] = ss[2], ss[1]; return ss }, pub, auditchain.Missing, 3},
		{"a seal's records hash changed", func(ss []auditchain.Seal) []auditchain.Seal {
			ss[1].Records = sha([]byte("other"))
			return ss
		}, nil, auditchain.Changed, 2},
		{"a seal recomputed over other records, without the key", func(ss []auditchain.Seal) []auditchain.Seal {
			ss[1].Records = sha([]byte("other"))
			ss[1].Hash, _ = ss[1].Compute()
			ss[1].Signature = attacker.Sign(ss[1].Hash)
			return ss
		}, pub, auditchain.BadSignature, 2},
		{"a forged seal with a wrong previous hash", func(ss []auditchain.Seal) []auditchain.Seal {
			ss[2].Prev = sha([]byte("elsewhere"))
			ss[2].Hash, _ = ss[2].Compute()
			return ss
		}, nil, auditchain.Changed, 3},
		{"a batch cut short", func(ss []auditchain.Seal) []auditchain.Seal {
			ss[1].Count = 1
			ss[1].Hash, _ = ss[1].Compute()
			return ss
		}, nil, auditchain.Changed, 3},
		{"unsigned under a public key", func(ss []auditchain.Seal) []auditchain.Seal {
			return seals(t, 3, nil)
		}, pub, auditchain.BadSignature, 1},
		{"the first seal not from genesis", func(ss []auditchain.Seal) []auditchain.Seal {
			ss[0].Prev = sha([]byte("x"))
			ss[0].Hash, _ = ss[0].Compute()
			return ss[:1]
		}, nil, auditchain.Changed, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := auditchain.VerifySealChain(tt.tamper(seals(t, 3, signer)), tt.pub)
			if p == nil || p.Kind != tt.kind || p.Seq != tt.seq || p.Chain != auditchain.SealChain {
				t.Fatalf("want %s at seal %d, got %v", tt.kind, tt.seq, p)
			}
		})
	}
	t.Run("a forgery without signatures passes when no key is given", func(t *testing.T) {
		ss := seals(t, 3, signer)
		ss[2].Records = sha([]byte("other"))
		ss[2].Hash, _ = ss[2].Compute()
		if p := auditchain.VerifySealChain(ss, nil); p != nil {
			t.Fatalf("the format claims nothing against a recomputation without signatures, got %v", p)
		}
	})
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
