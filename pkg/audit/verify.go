package audit

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

// VerifyOptions narrow a verification.
type VerifyOptions struct {
	// Since, when set, checks the chains with records written at or after it and the checkpoints written at or
	// after it (the first of which is trusted as a starting point).
	Since time.Time
	// OperationID, when set, checks that operation's chain against the checkpoints that sealed it (each one's
	// hash and signature; whether a checkpoint was removed is what a verification without it checks).
	OperationID string
	// Chains, with OperationID, are more chains checked the same way (the approvals an operation's timeline
	// shows).
	Chains []string
	// AccountID, when set, reads only that account's chains: with OperationID, the operation's account, so the
	// records and the head are found by their keys (account_id first), on the account's shard.
	AccountID string
	// PublicKey, when set, requires every checkpoint checked to carry a valid signature by its key.
	PublicKey ed25519.PublicKey
}

// Report is what Verify checked and found.
type Report struct {
	Chains      int
	Records     int
	Checkpoints int
	// LastCheckpoint is the newest checkpoint checked: an auditor may keep its hash to detect a later wipe.
	LastCheckpoint *auditchain.Checkpoint
	Problems       []auditchain.Problem
}

// Intact reports whether nothing is wrong.
func (r Report) Intact() bool { return len(r.Problems) == 0 }

// chainSource is a table of chained records.
type chainSource struct {
	table, chainColumn string
	// record builds the hashed content from the row: the same fields, in JSON, as the table's SQL
	// *_record function (migrations/00006_audit_chain.sql).
	columns string
	record  func(r recordRow) any
}

type recordRow struct {
	ID        int64
	Chain     string
	AccountID string
	Type      string
	Actor     string
	Detail    string
	FromState *string
	ToState   *string
	Attempt   *int64
	CreatedAt time.Time
	ChainSeq  int64
	PrevHash  string
	Hash      string
}

// approvalRecord is the hashed content of an approval_events record (approval_event_record in SQL).
type approvalRecord struct {
	AccountID  string          `json:"account_id"`
	Actor      string          `json:"actor"`
	ApprovalID string          `json:"approval_id"`
	CreatedAt  string          `json:"created_at"`
	Detail     json.RawMessage `json:"detail"`
	Type       string          `json:"type"`
}

var sources = []chainSource{
	{
		table: "operation_events", chainColumn: "operation_id",
		columns: `id, operation_id AS chain, account_id, type, actor, detail::text AS detail, from_state, to_state, attempt, created_at, chain_seq, prev_hash, hash`,
		record: func(r recordRow) any {
			return OperationEvent{
				OperationID: r.Chain, AccountID: r.AccountID, Type: r.Type, Actor: r.Actor, FromState: r.FromState,
				ToState: r.ToState, Detail: json.RawMessage(r.Detail), Attempt: r.Attempt, CreatedAt: r.CreatedAt,
			}.record()
		},
	},
	{
		table: "approval_events", chainColumn: "approval_id",
		columns: `id, approval_id AS chain, account_id, type, actor, detail::text AS detail, created_at, chain_seq, prev_hash, hash`,
		record: func(r recordRow) any {
			return approvalRecord{AccountID: r.AccountID, Actor: r.Actor, ApprovalID: r.Chain,
				CreatedAt: auditchain.FormatTime(r.CreatedAt), Detail: json.RawMessage(r.Detail), Type: r.Type}
		},
	},
}

// Verify checks, in one read-only snapshot, the checkpoints, then every chain in scope against them and against
// the head table. It returns an error only when it could not check (the database is unreachable, a table is
// missing); what is wrong with the records is in the Report.
func Verify(ctx context.Context, db *gorm.DB, opt VerifyOptions) (Report, error) {
	var rep Report
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		return verifyIn(ctx, tx, opt, &rep)
	}, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return Report{}, fmt.Errorf("audit: verify: %w", err)
	}
	return rep, nil
}

func verifyIn(ctx context.Context, tx *gorm.DB, opt VerifyOptions, rep *Report) error {
	q := `SELECT ` + checkpointColumns + ` FROM audit_checkpoints`
	var args []any
	switch {
	case opt.OperationID != "":
		for i, chain := range append([]string{opt.OperationID}, opt.Chains...) {
			if i == 0 {
				q += ` WHERE heads @> ?::jsonb`
			} else {
				q += ` OR heads @> ?::jsonb`
			}
			seal, err := json.Marshal([]map[string]string{{"chain": chain}})
			if err != nil {
				return err
			}
			args = append(args, string(seal))
		}
	case !opt.Since.IsZero():
		q += ` WHERE created_at >= ?`
		args = append(args, opt.Since)
	}
	var cpRows []checkpointRow
	if err := tx.Raw(q+` ORDER BY seq`, args...).Scan(&cpRows).Error; err != nil {
		return err
	}
	cps := make([]auditchain.Checkpoint, 0, len(cpRows))
	for _, r := range cpRows {
		cp, err := r.checkpoint()
		if err != nil {
			rep.Problems = append(rep.Problems, auditchain.Problem{Kind: auditchain.Changed, Chain: auditchain.CheckpointChain,
				Seq: r.Seq, Ref: fmt.Sprintf("checkpoint %d", r.Seq), Detail: "its heads are not valid JSON"})
			continue
		}
		cps = append(cps, cp)
	}
	rep.Checkpoints = len(cpRows)
	if len(cps) > 0 {
		rep.LastCheckpoint = &cps[len(cps)-1]
	}
	verifyCheckpoints := auditchain.VerifyCheckpoints
	if opt.OperationID != "" {
		verifyCheckpoints = auditchain.VerifySeals
	}
	want, p := verifyCheckpoints(cps, opt.PublicKey)
	if p != nil {
		rep.Problems = append(rep.Problems, *p)
	}

	// Which chains: all, or those in scope plus every chain an in-scope checkpoint sealed.
	var names []string
	scoped := opt.OperationID != "" || !opt.Since.IsZero()
	if scoped {
		set := map[string]bool{}
		if opt.OperationID != "" {
			set[opt.OperationID] = true
			for _, c := range opt.Chains {
				set[c] = true
			}
		} else {
			for name := range want {
				set[name] = true
			}
			for _, s := range sources {
				var moved []string
				err := tx.Raw(`SELECT DISTINCT `+s.chainColumn+` FROM `+s.table+` WHERE created_at >= ?`, opt.Since).Scan(&moved).Error
				if err != nil {
					return err
				}
				for _, n := range moved {
					set[n] = true
				}
			}
		}
		for n := range set {
			names = append(names, n)
		}
	}

	var v auditchain.Verifier
	for name, e := range want {
		if !scoped || contains(names, name) {
			v.Expect(e)
		}
	}
	// The head table is the store's own bookkeeping: weaker evidence than a signed checkpoint, but it covers the
	// records written since the last checkpoint.
	var heads []auditchain.Head
	hq := `SELECT chain, seq, hash FROM audit_chain_heads WHERE true`
	var hargs []any
	if opt.AccountID != "" {
		hq += ` AND account_id = ?`
		hargs = append(hargs, opt.AccountID)
	}
	if scoped {
		hq += ` AND chain IN ?`
		hargs = append(hargs, names)
	}
	if err := tx.Raw(hq, hargs...).Scan(&heads).Error; err != nil {
		return err
	}
	for _, h := range heads {
		v.Expect(auditchain.Expectation{Head: h, Source: "the chain head table"})
	}

	for _, s := range sources {
		if err := verifySource(ctx, tx, s, opt.AccountID, scoped, names, &v); err != nil {
			return err
		}
	}
	v.Finish(func(chain string) bool { return !scoped || contains(names, chain) })
	rep.Chains, rep.Records = v.Chains, v.Records
	rep.Problems = append(rep.Problems, v.Problems...)
	return nil
}

func contains(names []string, n string) bool {
	for _, x := range names {
		if x == n {
			return true
		}
	}
	return false
}

// verifySource streams one table's records, ordered by chain and then by storage order (the order readers see),
// and verifies each chain as it completes.
func verifySource(ctx context.Context, tx *gorm.DB, s chainSource, accountID string, scoped bool, names []string, v *auditchain.Verifier) error {
	q := `SELECT ` + s.columns + ` FROM ` + s.table + ` WHERE true`
	var args []any
	if accountID != "" {
		q += ` AND account_id = ?`
		args = append(args, accountID)
	}
	if scoped {
		q += ` AND ` + s.chainColumn + ` IN ?`
		args = append(args, names)
	}
	rows, err := tx.WithContext(ctx).Raw(q+` ORDER BY `+s.chainColumn+`, id`, args...).Rows()
	if err != nil {
		return err
	}
	defer rows.Close()
	var cur string
	var recs []auditchain.Record
	flush := func() {
		if cur != "" {
			v.Chain(cur, recs)
		}
		recs = recs[:0]
	}
	for rows.Next() {
		var r recordRow
		if err := tx.ScanRows(rows, &r); err != nil {
			return err
		}
		if r.Chain != cur {
			flush()
			cur = r.Chain
		}
		body, err := json.Marshal(s.record(r))
		if err != nil {
			return err
		}
		recs = append(recs, auditchain.Record{Chain: r.Chain, Seq: r.ChainSeq, Prev: r.PrevHash, Hash: r.Hash,
			Body: body, Ref: fmt.Sprintf("%s id %d", s.table, r.ID)})
	}
	if err := rows.Err(); err != nil {
		return err
	}
	flush()
	return nil
}
