package auditchain

import (
	"fmt"
	"slices"
)

// Kind is what is wrong with a record or seal.
type Kind string

const (
	// Changed: a record's content no longer matches its hash, or a record was rewritten with a recomputed hash
	// that its successor does not link to.
	Changed Kind = "changed"
	// Missing: records (a middle one, a chain's tail, a whole chain) or seals are gone.
	Missing Kind = "missing"
	// Inserted: a record that was never part of the chain (a second record with a seq already taken), or one
	// that no seal holds though later records are sealed.
	Inserted Kind = "inserted"
	// OutOfOrder: records are stored in another order than the chain's.
	OutOfOrder Kind = "out of order"
	// BadSignature: a seal's signature does not verify with the auditor's public key, or is absent.
	BadSignature Kind = "bad signature"
)

// SealChain is the Chain name problems of the chain of seals carry.
const SealChain = "(seals)"

// Problem is the first bad record of one chain (or subject), or of the seals.
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

// Verifier checks chains one by one: each record's hash and its link to the one before.
type Verifier struct {
	Chains   int
	Records  int
	Problems []Problem
}

// Chain verifies every record of one chain, given in stored order (the order readers show them in). It
// records the chain's first problem, if any.
func (v *Verifier) Chain(name string, recs []Record) {
	v.Chains++
	v.Records += len(recs)
	if p := v.check(name, recs); p != nil {
		v.Problems = append(v.Problems, *p)
	}
}

func (v *Verifier) check(name string, recs []Record) *Problem {
	expectSeq, expectPrev := int64(1), Genesis
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
		expectSeq, expectPrev = r.Seq+1, r.Hash
	}
	return nil
}
