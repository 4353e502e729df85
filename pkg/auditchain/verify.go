package auditchain

import (
	"crypto/ed25519"
	"fmt"
	"slices"
)

// Kind is what is wrong with a record or checkpoint.
type Kind string

const (
	// Changed: a record's content no longer matches its hash, or a record was rewritten with a recomputed hash
	// that its successor does not link to.
	Changed Kind = "changed"
	// Missing: records (a middle one, a chain's tail, a whole chain) or checkpoints are gone.
	Missing Kind = "missing"
	// Inserted: a record that was never part of the chain (a second record with a seq already taken).
	Inserted Kind = "inserted"
	// OutOfOrder: records are stored in another order than the chain's.
	OutOfOrder Kind = "out of order"
	// CheckpointMismatch: a chain's record at a checkpointed seq is not the one the checkpoint sealed.
	CheckpointMismatch Kind = "checkpoint mismatch"
	// BadSignature: a checkpoint's signature does not verify with the auditor's public key, or is absent.
	BadSignature Kind = "bad signature"
)

// CheckpointChain is the Chain name problems of the checkpoint chain carry.
const CheckpointChain = "(checkpoints)"

// Problem is the first bad record of one chain (or of the checkpoints).
type Problem struct {
	Kind   Kind
	Chain  string
	Seq    int64
	Ref    string
	Detail string
}

func (p Problem) String() string {
	s := fmt.Sprintf("%s: %s seq %d", p.Kind, p.Chain, p.Seq)
	if p.Ref != "" {
		s += " (" + p.Ref + ")"
	}
	return s + ": " + p.Detail
}

// Expectation is a head some other evidence vouches for: a checkpoint, or the store's own head table.
type Expectation struct {
	Head
	// Source names the evidence, for reports: "checkpoint 12".
	Source string
}

// VerifyCheckpoints checks a run of checkpoints in stored order: seq and prev links, hashes, and, when pub is
// not nil, signatures. The first checkpoint's prev is trusted when its Seq is above 1 (a partial run, from
// --since). It returns, per chain, the latest head the checkpoints vouch for, and the first problem if any.
func VerifyCheckpoints(cps []Checkpoint, pub ed25519.PublicKey) (map[string]Expectation, *Problem) {
	want := map[string]Expectation{}
	for i, cp := range cps {
		ref := fmt.Sprintf("checkpoint %d", cp.Seq)
		bad := func(k Kind, format string, args ...any) (map[string]Expectation, *Problem) {
			return want, &Problem{Kind: k, Chain: CheckpointChain, Seq: cp.Seq, Ref: ref, Detail: fmt.Sprintf(format, args...)}
		}
		switch {
		case i == 0 && cp.Seq == 1 && cp.Prev != Genesis:
			return bad(Changed, "the first checkpoint does not start from genesis")
		case i > 0 && cp.Seq != cps[i-1].Seq+1:
			if cp.Seq > cps[i-1].Seq+1 {
				return bad(Missing, "checkpoints %d to %d are missing", cps[i-1].Seq+1, cp.Seq-1)
			}
			return bad(OutOfOrder, "stored after checkpoint %d", cps[i-1].Seq)
		case i > 0 && cp.Prev != cps[i-1].Hash:
			return bad(Changed, "it does not link to checkpoint %d: one of them was rewritten", cps[i-1].Seq)
		}
		h, err := cp.Compute()
		if err != nil || h != cp.Hash {
			return bad(Changed, "its content does not match its hash")
		}
		if pub != nil {
			if cp.Signature == "" {
				return bad(BadSignature, "it is not signed")
			}
			if !verifySignature(pub, cp) {
				return bad(BadSignature, "its signature does not verify with the given public key")
			}
		}
		for _, hd := range cp.Heads {
			want[hd.Chain] = Expectation{Head: hd, Source: ref}
		}
	}
	return want, nil
}

// VerifySeals checks checkpoints one by one, not as a chain: each one's hash and, when pub is not nil, its
// signature. It is for checking one subject's chain against the checkpoints that sealed it, without reading
// every checkpoint; VerifyCheckpoints checks that none was removed or reordered.
func VerifySeals(cps []Checkpoint, pub ed25519.PublicKey) (map[string]Expectation, *Problem) {
	want := map[string]Expectation{}
	for _, cp := range cps {
		ref := fmt.Sprintf("checkpoint %d", cp.Seq)
		h, err := cp.Compute()
		switch {
		case err != nil || h != cp.Hash:
			return want, &Problem{Kind: Changed, Chain: CheckpointChain, Seq: cp.Seq, Ref: ref, Detail: "its content does not match its hash"}
		case pub != nil && cp.Signature == "":
			return want, &Problem{Kind: BadSignature, Chain: CheckpointChain, Seq: cp.Seq, Ref: ref, Detail: "it is not signed"}
		case pub != nil && !verifySignature(pub, cp):
			return want, &Problem{Kind: BadSignature, Chain: CheckpointChain, Seq: cp.Seq, Ref: ref,
				Detail: "its signature does not verify with the given public key"}
		}
		for _, hd := range cp.Heads {
			if e, ok := want[hd.Chain]; !ok || hd.Seq >= e.Seq {
				want[hd.Chain] = Expectation{Head: hd, Source: ref}
			}
		}
	}
	return want, nil
}

// Verifier checks chains one by one against the expectations gathered before (VerifyCheckpoints, head tables).
type Verifier struct {
	Chains   int
	Records  int
	Problems []Problem

	expect map[string][]Expectation
	seen   map[string]bool
}

// Expect adds evidence that chain e.Chain reached e.Seq with e.Hash.
func (v *Verifier) Expect(e Expectation) {
	if v.expect == nil {
		v.expect = map[string][]Expectation{}
	}
	v.expect[e.Chain] = append(v.expect[e.Chain], e)
}

// Chain verifies every record of one chain, given in stored order (the order readers show them in). It
// records the chain's first problem, if any.
func (v *Verifier) Chain(name string, recs []Record) {
	if v.seen == nil {
		v.seen = map[string]bool{}
	}
	v.seen[name] = true
	v.Chains++
	v.Records += len(recs)
	if p := v.check(name, recs); p != nil {
		v.Problems = append(v.Problems, *p)
	}
}

func (v *Verifier) check(name string, recs []Record) *Problem {
	expectSeq, expectPrev := int64(1), Genesis
	hashAt := make(map[int64]string, len(recs))
	for i, r := range recs {
		bad := func(k Kind, format string, args ...any) *Problem {
			return &Problem{Kind: k, Chain: name, Seq: r.Seq, Ref: r.Ref, Detail: fmt.Sprintf(format, args...)}
		}
		if r.Seq != expectSeq {
			later := slices.IndexFunc(recs[i+1:], func(o Record) bool { return o.Seq == expectSeq })
			switch {
			case r.Seq == expectSeq-1:
				return bad(Inserted, "a second record with seq %d", r.Seq)
			case later >= 0:
				return bad(OutOfOrder, "stored before seq %d, which comes first in the chain", expectSeq)
			case r.Seq < expectSeq:
				return bad(OutOfOrder, "stored after seq %d", expectSeq-1)
			default:
				if r.Seq-1 == expectSeq {
					return bad(Missing, "record %d of the chain, right before it, is missing", expectSeq)
				}
				return bad(Missing, "records %d to %d of the chain, right before it, are missing", expectSeq, r.Seq-1)
			}
		}
		h, err := r.Compute()
		if err != nil || h != r.Hash {
			return bad(Changed, "its content does not match its hash")
		}
		if r.Prev != expectPrev {
			if r.Seq == 1 {
				return bad(Changed, "the first record does not start from genesis")
			}
			return &Problem{Kind: Changed, Chain: name, Seq: r.Seq - 1, Ref: recs[i-1].Ref,
				Detail: fmt.Sprintf("record %d does not link to it: it was replaced or rewritten with a recomputed hash", r.Seq)}
		}
		hashAt[r.Seq] = r.Hash
		expectSeq, expectPrev = r.Seq+1, r.Hash
	}
	last := expectSeq - 1
	for _, e := range v.expect[name] {
		switch h, ok := hashAt[e.Seq]; {
		case !ok && last == 0:
			return &Problem{Kind: Missing, Chain: name, Seq: e.Seq, Detail: e.Source + " covers this chain but it has no records"}
		case !ok:
			return &Problem{Kind: Missing, Chain: name, Seq: e.Seq,
				Detail: fmt.Sprintf("%s covers it, but the chain ends at seq %d: its tail was removed", e.Source, last)}
		case h != e.Hash:
			return &Problem{Kind: CheckpointMismatch, Chain: name, Seq: e.Seq,
				Detail: fmt.Sprintf("the chain is not the one %s sealed (it was rewritten)", e.Source)}
		}
	}
	return nil
}

// Finish reports every expected chain that Chain never saw and inScope accepts (nil: all) as missing.
func (v *Verifier) Finish(inScope func(chain string) bool) {
	names := make([]string, 0, len(v.expect))
	for name := range v.expect {
		if !v.seen[name] && (inScope == nil || inScope(name)) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		e := v.expect[name][0]
		v.Problems = append(v.Problems, Problem{Kind: Missing, Chain: name, Seq: e.Seq,
			Detail: e.Source + " covers this chain but it has no records: it was deleted"})
	}
}
