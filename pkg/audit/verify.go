package audit

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
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
	// Checkpoint, when set, is the hash of a checkpoint the auditor kept elsewhere: the checkpoints checked must
	// include it, so a record whose newest checkpoints were removed, or replaced by forged ones, fails.
	Checkpoint string
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
		var err error
		rep, err = check(&dbEvidence{ctx: ctx, tx: tx, opt: opt}, checkOptions{seals: opt.OperationID != "",
			whole: opt.OperationID == "" && opt.Since.IsZero(), pub: opt.PublicKey, pin: opt.Checkpoint})
		return err
	}, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return Report{}, fmt.Errorf("audit: verify: %w", err)
	}
	return rep, nil
}

// evidence is where a verification reads the audit record: the database (dbEvidence) or an exported bundle
// (bundleEvidence). Both are checked by check, so a bundle is held to exactly the checks the database is.
type evidence interface {
	// checkpoints returns the checkpoints in scope, in stored order.
	checkpoints() ([]checkpointRow, error)
	// scope names the chains to check, given the heads the checkpoints vouch for; scoped is false for all.
	scope(want map[string]auditchain.Expectation) (names []string, scoped bool, err error)
	// heads returns the store's own heads of the chains in scope.
	heads(scoped bool, names []string) ([]auditchain.Head, error)
	// chains gives emit each chain in scope as stored, its records in stored order (a chain given twice or
	// cut short is the verifier's to find).
	chains(scoped bool, names []string, emit func(name string, recs []auditchain.Record)) error
}

// checkOptions say how check holds the checkpoints.
type checkOptions struct {
	// seals checks them one by one (VerifySeals), not as one run: those that sealed one operation.
	seals bool
	// whole says they are all of them, so the run starts at the first: checkpoints are never deleted.
	whole bool
	pub   ed25519.PublicKey
	// pin is a checkpoint's hash they must include (VerifyOptions.Checkpoint).
	pin string
}

// check runs every check of a verification on ev: the checkpoints, then each chain in scope against them and
// against the heads.
func check(ev evidence, opt checkOptions) (Report, error) {
	var rep Report
	cpRows, err := ev.checkpoints()
	if err != nil {
		return Report{}, err
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
	if opt.seals {
		verifyCheckpoints = auditchain.VerifySeals
	}
	want, p := verifyCheckpoints(cps, opt.pub)
	if p == nil && opt.whole && len(cps) > 0 && cps[0].Seq != 1 {
		p = &auditchain.Problem{Kind: auditchain.Missing, Chain: auditchain.CheckpointChain, Seq: cps[0].Seq,
			Ref: fmt.Sprintf("checkpoint %d", cps[0].Seq), Detail: fmt.Sprintf("checkpoints 1 to %d, before it, are missing", cps[0].Seq-1)}
	}
	if p != nil {
		rep.Problems = append(rep.Problems, *p)
	}
	// The checks above hold each checkpoint's hash to its content and (in a run) to its successor's link, so a
	// pinned hash found among them is the one the auditor kept, and every checkpoint before it links to it.
	if pin := opt.pin; pin != "" && !slices.ContainsFunc(cps, func(cp auditchain.Checkpoint) bool { return cp.Hash == pin }) {
		rep.Problems = append(rep.Problems, auditchain.Problem{Kind: auditchain.Missing, Chain: auditchain.CheckpointChain,
			Detail: fmt.Sprintf("the pinned checkpoint %s is not among them: the newest checkpoints were removed or forged", pin)})
	}

	names, scoped, err := ev.scope(want)
	if err != nil {
		return Report{}, err
	}
	var v auditchain.Verifier
	for name, e := range want {
		if !scoped || contains(names, name) {
			v.Expect(e)
		}
	}
	// The head table is the store's own bookkeeping: weaker evidence than a signed checkpoint, but it covers the
	// records written since the last checkpoint.
	heads, err := ev.heads(scoped, names)
	if err != nil {
		return Report{}, err
	}
	for _, h := range heads {
		v.Expect(auditchain.Expectation{Head: h, Source: "the chain head table"})
	}
	if err := ev.chains(scoped, names, v.Chain); err != nil {
		return Report{}, err
	}
	v.Finish(func(chain string) bool { return !scoped || contains(names, chain) })
	rep.Chains, rep.Records = v.Chains, v.Records
	rep.Problems = append(rep.Problems, v.Problems...)
	return rep, nil
}

// dbEvidence reads the audit record from the database, in the caller's snapshot.
type dbEvidence struct {
	ctx context.Context
	tx  *gorm.DB
	opt VerifyOptions
	// until, when set, leaves out the checkpoints written after it and the records written after it from the
	// choice of chains (an export's --until).
	until time.Time
	// run, with opt.OperationID, reads the checkpoints as one unbroken run, from the first that sealed one of
	// the chains to the newest, so they can be checked as a chain (an export's --operation).
	run bool
}

func (e *dbEvidence) checkpoints() ([]checkpointRow, error) {
	q := `SELECT ` + checkpointColumns + ` FROM audit_checkpoints WHERE true`
	var args []any
	switch {
	case e.opt.OperationID != "":
		var sealed string
		for i, chain := range e.chainNames() {
			if i > 0 {
				sealed += ` OR `
			}
			sealed += `heads @> ?::jsonb`
			seal, err := json.Marshal([]map[string]string{{"chain": chain}})
			if err != nil {
				return nil, err
			}
			args = append(args, string(seal))
		}
		if e.run {
			q += ` AND seq >= (SELECT min(seq) FROM audit_checkpoints WHERE ` + sealed + `)`
		} else {
			q += ` AND (` + sealed + `)`
		}
	case !e.opt.Since.IsZero():
		q += ` AND created_at >= ?`
		args = append(args, e.opt.Since)
	}
	if !e.until.IsZero() {
		q += ` AND created_at <= ?`
		args = append(args, e.until)
	}
	var rows []checkpointRow
	if err := e.tx.WithContext(e.ctx).Raw(q+` ORDER BY seq`, args...).Scan(&rows).Error; err != nil {
		return nil, err
	}
	return rows, nil
}

// chainNames is the operation's chain and the other chains checked with it.
func (e *dbEvidence) chainNames() []string {
	return append([]string{e.opt.OperationID}, e.opt.Chains...)
}

// scope is every chain, or those of the operation, or those an in-scope checkpoint sealed and those with records
// written in the time range.
func (e *dbEvidence) scope(want map[string]auditchain.Expectation) ([]string, bool, error) {
	if e.opt.OperationID != "" {
		return e.chainNames(), true, nil
	}
	if e.opt.Since.IsZero() && e.until.IsZero() {
		return nil, false, nil
	}
	set := map[string]bool{}
	for name := range want {
		set[name] = true
	}
	for _, s := range sources {
		q := `SELECT DISTINCT ` + s.chainColumn + ` FROM ` + s.table + ` WHERE true`
		var args []any
		if !e.opt.Since.IsZero() {
			q += ` AND created_at >= ?`
			args = append(args, e.opt.Since)
		}
		if !e.until.IsZero() {
			q += ` AND created_at <= ?`
			args = append(args, e.until)
		}
		var moved []string
		if err := e.tx.WithContext(e.ctx).Raw(q, args...).Scan(&moved).Error; err != nil {
			return nil, false, err
		}
		for _, n := range moved {
			set[n] = true
		}
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, true, nil
}

func (e *dbEvidence) heads(scoped bool, names []string) ([]auditchain.Head, error) {
	var heads []auditchain.Head
	hq := `SELECT chain, seq, hash FROM audit_chain_heads WHERE true`
	var hargs []any
	if e.opt.AccountID != "" {
		hq += ` AND account_id = ?`
		hargs = append(hargs, e.opt.AccountID)
	}
	if scoped {
		hq += ` AND chain IN ?`
		hargs = append(hargs, names)
	}
	if err := e.tx.WithContext(e.ctx).Raw(hq+` ORDER BY chain`, hargs...).Scan(&heads).Error; err != nil {
		return nil, err
	}
	return heads, nil
}

func (e *dbEvidence) chains(scoped bool, names []string, emit func(string, []auditchain.Record)) error {
	for _, s := range sources {
		if err := verifySource(e.ctx, e.tx, s, e.opt.AccountID, scoped, names, emit); err != nil {
			return err
		}
	}
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
func verifySource(ctx context.Context, tx *gorm.DB, s chainSource, accountID string, scoped bool, names []string, emit func(string, []auditchain.Record)) error {
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
			emit(cur, recs)
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
