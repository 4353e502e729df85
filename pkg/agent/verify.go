package agent

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

// VerifyReport is what VerifyJournal found.
type VerifyReport struct {
	Chains, Records int
	Problems        []auditchain.Problem
	// TornBytes is the length of an unfinished last line: a write that never completed, discarded by the next
	// writer, outside the chain and so not a break.
	TornBytes int
}

// Intact reports whether every record links.
func (r VerifyReport) Intact() bool { return len(r.Problems) == 0 }

// VerifyJournal checks a journal offline with the server's verification code (auditchain): every record's
// hash, every link, no record missing, inserted or moved. An error means the file could not be checked at all.
//
// As with any hash chain kept by its writer, a journal cut short at its end, or rewritten whole with every
// hash recomputed, is not detectable from the file alone; keep a copy of the last line's hash elsewhere to
// cover that.
func VerifyJournal(path string) (VerifyReport, error) {
	f, err := os.Open(path)
	if err != nil {
		return VerifyReport{}, fmt.Errorf("agent: verify: %w", err)
	}
	defer f.Close()
	entries, tail, err := readEntries(f)
	if err != nil {
		return VerifyReport{}, err
	}
	if len(entries) == 0 {
		return VerifyReport{}, fmt.Errorf("agent: verify: %s has no records", path)
	}
	rep := verifyEntries(entries)
	rep.TornBytes = len(tail)
	return rep, nil
}

// verifyEntries checks parsed journal lines; Open runs it too, so an agent never acts on a broken journal.
func verifyEntries(entries []entry) VerifyReport {
	byChain := map[string][]auditchain.Record{}
	var order []string
	for i, e := range entries {
		if _, ok := byChain[e.Chain]; !ok {
			order = append(order, e.Chain)
		}
		byChain[e.Chain] = append(byChain[e.Chain], auditchain.Record{Chain: e.Chain, Seq: e.Seq, Prev: e.Prev, Hash: e.Hash,
			Body: e.Record, Ref: fmt.Sprintf("line %d", i+1)})
	}
	var v auditchain.Verifier
	for _, name := range order {
		v.Chain(name, byChain[name])
	}
	rep := VerifyReport{Chains: v.Chains, Records: v.Records, Problems: v.Problems}
	if len(order) > 1 {
		// A journal is one chain: a second one is records spliced in from elsewhere.
		rep.Problems = append(rep.Problems, auditchain.Problem{Kind: auditchain.Inserted, Chain: order[1], Seq: byChain[order[1]][0].Seq,
			Ref: byChain[order[1]][0].Ref, Detail: "a journal holds one chain; this one is foreign"})
	}
	var first struct {
		Type string `json:"type"`
	}
	if len(entries) > 0 && (json.Unmarshal(entries[0].Record, &first) != nil || first.Type != RecJournalOpened) {
		rep.Problems = append(rep.Problems, auditchain.Problem{Kind: auditchain.Missing, Chain: entries[0].Chain, Seq: entries[0].Seq,
			Ref: "line 1", Detail: "the journal does not start with its journal_opened record"})
	}
	return rep
}
