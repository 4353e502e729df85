package audit

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/database"
)

// VerifyOptions narrow a verification.
type VerifyOptions struct {
	// Since, when set, checks the seals written at or after it (the first of which is trusted as a starting
	// point), the records they hold, and the records not sealed yet.
	Since time.Time
	// OperationID, when set, checks that operation's records against the seals that hold them (each one's hash,
	// signature and entries; whether a seal was removed is what a verification without it checks).
	OperationID string
	// Subjects, with OperationID, are more subjects checked the same way (the approvals an operation's timeline
	// shows).
	Subjects []string
	// AccountID, when set with OperationID, is the operation's account, so its records are found by their keys
	// (account_id first), on the account's shard.
	AccountID string
	// PublicKey, when set, requires every seal checked to carry a valid signature by its key.
	PublicKey ed25519.PublicKey
	// Seal, when set, is the hash of a seal the auditor kept elsewhere: the seals checked must include it, so
	// records whose newest seals were removed, or replaced by forged ones, fail.
	Seal string
}

// Report is what Verify checked and found.
type Report struct {
	// Subjects counts the operations and approvals whose records were checked.
	Subjects int
	// Records counts the records checked; Sealed those a seal holds, Unsealed those none holds yet.
	Records, Sealed, Unsealed int
	// OldestUnsealed is when the oldest unsealed record was written (zero when none is).
	OldestUnsealed time.Time
	Seals          int
	// LastSeal is the newest seal checked: an auditor may keep its hash to detect a later wipe.
	LastSeal *auditchain.Seal
	Problems []auditchain.Problem
}

// Intact reports whether nothing is wrong.
func (r Report) Intact() bool { return len(r.Problems) == 0 }

// Stalled reports whether an unsealed record is older than ten seal intervals at now: the sequencer is not
// running, or cannot keep up, or a transaction has been open that long.
func (r Report) Stalled(now time.Time, interval time.Duration) bool {
	if interval <= 0 {
		interval = DefaultSealInterval
	}
	return !r.OldestUnsealed.IsZero() && now.Sub(r.OldestUnsealed) > 10*interval
}

// Verify checks, in one read-only snapshot, the seals, then every record in scope against them. It returns an
// error only when it could not check (the database is unreachable, a table is missing); what is wrong with the
// records is in the Report.
func Verify(ctx context.Context, db database.Pool, opt VerifyOptions) (Report, error) {
	var rep Report
	err := database.InTx(ctx, db, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}, func(tx *sql.Tx) error {
		var err error
		ev := &dbEvidence{ctx: ctx, tx: tx, opt: opt}
		rep, err = check(ev, checkOptions{one: opt.OperationID != "", whole: opt.OperationID == "" && opt.Since.IsZero(),
			pub: opt.PublicKey, pin: opt.Seal, subjects: ev.subjects()})
		return err
	})
	if err != nil {
		return Report{}, fmt.Errorf("audit: verify: %w", err)
	}
	return rep, nil
}

// storedRecord is one record as evidence holds it.
type storedRecord struct {
	Table     string
	ID        int64
	Pos       auditchain.Position
	AccountID string
	Subject   string
	CreatedAt time.Time
	// Body is the content its hash covers, as JSON.
	Body json.RawMessage
}

// evidence is where a verification reads the audit record: the database (dbEvidence) or an exported bundle
// (bundleEvidence). Both are checked by check, so a bundle is held to exactly the checks the database is.
type evidence interface {
	// seals calls emit for each seal in scope, in stored order; its Records are nil when the evidence holds
	// only its header.
	seals(emit func(sealRow) error) error
	// through is where the newest seal ends in each table, whether or not it is in scope.
	through() (map[string]auditchain.Position, error)
	// records calls emit for each record in scope: those sealed, named by sealed, and those not sealed yet.
	records(sealed map[recordKey]*expected, emit func(storedRecord) error) error
}

// checkOptions say how check holds the seals.
type checkOptions struct {
	// one checks them one by one (VerifySeal), not as a run: those that hold one operation's records.
	one bool
	// whole says they are all of them, so the run starts at the first: seals are never deleted.
	whole bool
	pub   ed25519.PublicKey
	// pin is a seal's hash they must include, or start right after (VerifyOptions.Seal).
	pin string
	// pinAnchors says that a run not starting at the first seal must start right after the pin: a bundle's
	// scope, which would excuse the missing first seals, is not evidence.
	pinAnchors bool
	// subjects, when not nil, are the only subjects whose records are checked.
	subjects map[string]bool
}

type recordKey struct {
	table string
	id    int64
}

// expected is a record a seal holds.
type expected struct {
	entry   auditchain.Entry
	seal    int64
	ordinal int64
	seen    bool
}

// mismatch is a record whose content is not what its entry holds.
type mismatch struct {
	rec      storedRecord
	exp      *expected
	computed string
}

// check runs every check of a verification on ev: the seals, then each record in scope against them.
func check(ev evidence, opt checkOptions) (Report, error) {
	c := &checker{opt: opt, sealed: map[recordKey]*expected{}, subjects: map[string]bool{}, unsealed: map[recordKey]bool{}}
	if err := ev.seals(c.readSeal); err != nil {
		return Report{}, err
	}
	if len(c.seals) > 0 {
		c.rep.LastSeal = &c.seals[len(c.seals)-1]
	}
	if p := c.chainProblem(); p != nil {
		c.problems = append([]auditchain.Problem{*p}, c.problems...)
	}
	c.checkPin()
	through, err := ev.through()
	if err != nil {
		return Report{}, err
	}
	c.through = through
	if err := ev.records(c.sealed, c.readRecord); err != nil {
		return Report{}, err
	}
	c.rep.Subjects = len(c.subjects)
	c.problems = append(c.problems, c.subjectProblems()...)
	c.rep.Problems = c.problems
	return c.rep, nil
}

// checker is one verification under way: what check has read so far, and the problems it found.
type checker struct {
	opt      checkOptions
	rep      Report
	problems []auditchain.Problem
	seals    []auditchain.Seal
	// sealed are the records the seals hold.
	sealed map[recordKey]*expected
	// through is where the newest seal ends in each table.
	through map[string]auditchain.Position
	// subjects are those whose records were counted; unsealed the records counted that no seal holds.
	subjects map[string]bool
	unsealed map[recordKey]bool
	// mismatches are the sealed records whose content is not what their entry holds.
	mismatches []mismatch
}

func (c *checker) sealProblem(k auditchain.Kind, seq int64, format string, args ...any) {
	c.problems = append(c.problems, auditchain.Problem{Kind: k, Chain: auditchain.SealChain, Seq: seq,
		Ref: fmt.Sprintf("seal %d", seq), Detail: fmt.Sprintf(format, args...)})
}

func (c *checker) recordProblem(k auditchain.Kind, r storedRecord, detail string) {
	c.problems = append(c.problems, auditchain.Problem{Kind: k, Chain: r.Subject,
		Ref: fmt.Sprintf("%s id %d", r.Table, r.ID), Detail: detail})
}

// readSeal takes one seal and, when the evidence holds them, its entries: a seal whose entries do not match
// the hash and count it carries vouches for none of them.
func (c *checker) readSeal(r sealRow) error {
	c.rep.Seals++
	s, err := r.seal()
	if err != nil {
		c.sealProblem(auditchain.Changed, r.Seq, "its through is not valid JSON")
		return nil
	}
	c.seals = append(c.seals, s)
	if r.Records == nil {
		return nil
	}
	raw := json.RawMessage(*r.Records)
	var entries []auditchain.Entry
	if err := json.Unmarshal(raw, &entries); err != nil {
		c.sealProblem(auditchain.Changed, s.Seq, "its entries are not valid JSON")
		return nil
	}
	if h, err := auditchain.RecordsHash(raw); err != nil || h != s.Records || int64(len(entries)) != s.Count {
		c.sealProblem(auditchain.Changed, s.Seq, "its entries do not match the hash and count it carries")
		return nil
	}
	c.expect(s, entries)
	return nil
}

// expect notes the entries of seal s in scope as the records it holds; one that an earlier seal holds too is
// inserted.
func (c *checker) expect(s auditchain.Seal, entries []auditchain.Entry) {
	for i, e := range entries {
		if c.opt.subjects != nil && !c.opt.subjects[e.Subject] {
			continue
		}
		k := recordKey{e.Table, e.ID}
		if before, ok := c.sealed[k]; ok {
			c.problems = append(c.problems, auditchain.Problem{Kind: auditchain.Inserted, Chain: e.Subject, Seq: s.First + int64(i),
				Ref: fmt.Sprintf("%s id %d", e.Table, e.ID), Detail: fmt.Sprintf("seals %d and %d both hold it", before.seal, s.Seq)})
			continue
		}
		c.sealed[k] = &expected{entry: e, seal: s.Seq, ordinal: s.First + int64(i)}
	}
}

// chainProblem is the first problem with the seals themselves: each one's hash and signature, and, in a run,
// each one's link to the one before; a whole record must start at seal 1.
func (c *checker) chainProblem() *auditchain.Problem {
	seals := c.seals
	if c.opt.one {
		for _, s := range seals {
			if p := auditchain.VerifySeal(s, c.opt.pub); p != nil {
				return p
			}
		}
	} else if p := auditchain.VerifySealChain(seals, c.opt.pub); p != nil {
		return p
	}
	if c.opt.whole && len(seals) > 0 && seals[0].Seq != 1 {
		return &auditchain.Problem{Kind: auditchain.Missing, Chain: auditchain.SealChain, Seq: seals[0].Seq,
			Ref: fmt.Sprintf("seal %d", seals[0].Seq), Detail: fmt.Sprintf("seals 1 to %d, before it, are missing", seals[0].Seq-1)}
	}
	return nil
}

// checkPin holds the seals to the pinned hash (checkOptions.pin). The chain's checks hold each seal's hash to
// its content and (in a run) to its successor's link, so a pinned hash found among them, or as the first one's
// link, is the one the auditor kept, and every seal before it links to it.
func (c *checker) checkPin() {
	pin, seals := c.opt.pin, c.seals
	afterPin := len(seals) > 0 && seals[0].Prev == pin
	switch {
	case pin == "":
	case !afterPin && !slices.ContainsFunc(seals, func(s auditchain.Seal) bool { return s.Hash == pin }):
		c.problems = append(c.problems, auditchain.Problem{Kind: auditchain.Missing, Chain: auditchain.SealChain,
			Detail: fmt.Sprintf("the pinned seal %s is not among them: the newest seals were removed or forged", pin)})
	case c.opt.pinAnchors && !afterPin && seals[0].Seq != 1:
		c.problems = append(c.problems, auditchain.Problem{Kind: auditchain.Missing, Chain: auditchain.SealChain, Seq: seals[0].Seq,
			Ref: fmt.Sprintf("seal %d", seals[0].Seq), Detail: fmt.Sprintf("seals 1 to %d are not here, and the pinned seal is "+
				"not the one right before them: with --seal, the seals start at seal 1 or right after the pinned one, "+
				"whatever the scope says", seals[0].Seq-1)})
	}
}

// readRecord counts one stored record in scope and checks it against the seal that holds it, or, when none
// does, against where the seals end.
func (c *checker) readRecord(r storedRecord) error {
	if c.opt.subjects != nil && !c.opt.subjects[r.Subject] {
		return nil
	}
	if !slices.ContainsFunc(sources, func(s source) bool { return s.table == r.Table }) {
		c.recordProblem(auditchain.Inserted, r, "no table of audit records has that name")
		return nil
	}
	k := recordKey{r.Table, r.ID}
	exp, ok := c.sealed[k]
	if (ok && exp.seen) || c.unsealed[k] {
		c.recordProblem(auditchain.Inserted, r, "it is there twice: a record is counted once")
		return nil
	}
	c.rep.Records++
	c.subjects[r.Subject] = true
	if !ok {
		c.unsealed[k] = true
		c.readUnsealed(r)
		return nil
	}
	exp.seen = true
	c.rep.Sealed++
	h, err := auditchain.RecordHash(r.Body)
	if err != nil || h != exp.entry.Hash || r.Subject != exp.entry.Subject || r.AccountID != exp.entry.AccountID {
		c.mismatches = append(c.mismatches, mismatch{rec: r, exp: exp, computed: h})
	}
	return nil
}

// readUnsealed counts a record no seal holds: it must come after where the seals end in its table.
func (c *checker) readUnsealed(r storedRecord) {
	if at, ok := c.through[r.Table]; ok && !after(r.Pos, at) {
		c.recordProblem(auditchain.Inserted, r,
			"no seal holds it, though the seals hold every record written before it and after")
		return
	}
	c.rep.Unsealed++
	if c.rep.OldestUnsealed.IsZero() || r.CreatedAt.Before(c.rep.OldestUnsealed) {
		c.rep.OldestUnsealed = r.CreatedAt
	}
}

// subjectProblems are the problems of the sealed records, one per subject (its first by sealed order), in
// the order of the subjects' names: a record changed, or records of one subject that hold each other's content
// (reordered), or records a seal holds that are gone.
func (c *checker) subjectProblems() []auditchain.Problem {
	type firstProblem struct {
		ordinal int64
		p       auditchain.Problem
	}
	bySubject := map[string]firstProblem{}
	note := func(subject string, ordinal int64, p auditchain.Problem) {
		if cur, ok := bySubject[subject]; !ok || ordinal < cur.ordinal {
			bySubject[subject] = firstProblem{ordinal, p}
		}
	}
	reordered := c.reorderedSubjects()
	for _, m := range c.mismatches {
		s := m.exp.entry.Subject
		kind, detail := auditchain.Changed, fmt.Sprintf("its content does not match what seal %d holds", m.exp.seal)
		if reordered[s] {
			kind, detail = auditchain.OutOfOrder, fmt.Sprintf("it holds the content seal %d holds for another record of %s", m.exp.seal, s)
		}
		note(s, m.exp.ordinal, auditchain.Problem{Kind: kind, Chain: s, Seq: m.exp.ordinal,
			Ref: fmt.Sprintf("%s id %d", m.rec.Table, m.rec.ID), Detail: detail})
	}
	for _, exp := range c.sealed {
		if !exp.seen {
			note(exp.entry.Subject, exp.ordinal, auditchain.Problem{Kind: auditchain.Missing, Chain: exp.entry.Subject, Seq: exp.ordinal,
				Ref: fmt.Sprintf("%s id %d", exp.entry.Table, exp.entry.ID), Detail: fmt.Sprintf("seal %d holds it, but it is gone", exp.seal)})
		}
	}
	problems := make([]auditchain.Problem, 0, len(bySubject))
	for _, s := range slices.Sorted(maps.Keys(bySubject)) {
		problems = append(problems, bySubject[s].p)
	}
	return problems
}

// reorderedSubjects are the subjects with more than one mismatched record whose records hold between them
// exactly the contents their entries do: reordered, not changed.
func (c *checker) reorderedSubjects() map[string]bool {
	stored, held := map[string][]string{}, map[string][]string{}
	for _, m := range c.mismatches {
		stored[m.exp.entry.Subject] = append(stored[m.exp.entry.Subject], m.computed)
		held[m.exp.entry.Subject] = append(held[m.exp.entry.Subject], m.exp.entry.Hash)
	}
	reordered := map[string]bool{}
	for s, a := range stored {
		b := held[s]
		slices.Sort(a)
		slices.Sort(b)
		reordered[s] = len(a) > 1 && slices.Equal(a, b)
	}
	return reordered
}

// after reports whether p comes after at in (xid, id) order.
func after(p, at auditchain.Position) bool {
	px, _ := strconv.ParseUint(p.XID, 10, 64)
	ax, _ := strconv.ParseUint(at.XID, 10, 64)
	return px > ax || (px == ax && p.ID > at.ID)
}

// dbEvidence reads the audit record from the database, in the caller's snapshot.
type dbEvidence struct {
	ctx context.Context
	tx  database.DBTX
	opt VerifyOptions
	// until, when set, leaves out the seals written after it (an export's --until), and the unsealed records.
	until time.Time
	// run, with opt.OperationID, reads the seals as one unbroken run, from the first that holds one of the
	// subjects' records to the newest, so they can be checked as a chain (an export's --operation); the entries
	// of the others are left out.
	run bool
}

// subjects is the operation and the other subjects checked with it; nil for all.
func (e *dbEvidence) subjects() map[string]bool {
	if e.opt.OperationID == "" {
		return nil
	}
	set := map[string]bool{e.opt.OperationID: true}
	for _, s := range e.opt.Subjects {
		set[s] = true
	}
	return set
}

func (e *dbEvidence) subjectList() []string {
	return append([]string{e.opt.OperationID}, e.opt.Subjects...)
}

// holds is a condition true of a seal that holds a record of one of subjects, found through the index
// audit_seals_subjects; it appends its arguments to args, after which it numbers its parameters.
func holds(subjects []string, args *[]any) string {
	q := `(false`
	for _, s := range subjects {
		one, _ := json.Marshal([]string{s})
		q += ` OR jsonb_path_query_array(records, '$[*].subject') @> ` + param(args, string(one)) + `::jsonb`
	}
	return q + `)`
}

// param appends v to args and returns its parameter ($n).
func param(args *[]any, v any) string {
	*args = append(*args, v)
	return "$" + strconv.Itoa(len(*args))
}

func (e *dbEvidence) seals(emit func(sealRow) error) error {
	columns := sealColumns
	q := ` FROM audit_seals WHERE true`
	var args []any
	switch {
	case e.opt.OperationID != "" && e.run:
		cond := holds(e.subjectList(), &args)
		columns = `seq, prev_hash, created_at, first_record, record_count, through::text AS through,
CASE WHEN ` + cond + ` THEN records::text END AS records, records_hash, hash, signature`
		q += ` AND seq >= (SELECT min(seq) FROM audit_seals WHERE ` + cond + `)`
	case e.opt.OperationID != "":
		q += ` AND ` + holds(e.subjectList(), &args)
	case !e.opt.Since.IsZero():
		q += ` AND created_at >= ` + param(&args, e.opt.Since)
	}
	if !e.until.IsZero() {
		q += ` AND created_at <= ` + param(&args, e.until)
	}
	rows, err := e.tx.QueryContext(e.ctx, `SELECT `+columns+q+` ORDER BY seq`, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var r sealRow
		if err := rows.Scan(r.dest()...); err != nil {
			return err
		}
		if err := emit(r); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (e *dbEvidence) through() (map[string]auditchain.Position, error) {
	return newestThrough(e.ctx, e.tx)
}

// records reads every record (the whole record), the subjects' records (an operation), or the records the seals
// in scope hold and those not sealed yet (a time range).
func (e *dbEvidence) records(sealed map[recordKey]*expected, emit func(storedRecord) error) error {
	switch {
	case e.opt.OperationID != "":
		return e.subjectRecords(emit)
	case e.opt.Since.IsZero() && e.until.IsZero():
		return e.allRecords(emit)
	}
	return e.rangeRecords(sealed, emit)
}

// subjectRecords reads the records of the operation and the subjects checked with it, by their account's keys
// when the account is known.
func (e *dbEvidence) subjectRecords(emit func(storedRecord) error) error {
	for _, src := range sources {
		if err := src.ofSubjects(e.ctx, e.tx, e.opt.AccountID, e.subjectList(), stored(src, emit)); err != nil {
			return err
		}
	}
	return nil
}

// allRecords reads every record of every table.
func (e *dbEvidence) allRecords(emit func(storedRecord) error) error {
	for _, src := range sources {
		if err := src.all(e.ctx, e.tx, stored(src, emit)); err != nil {
			return err
		}
	}
	return nil
}

// rangeRecords reads the records sealed names and, without an until, those not sealed yet.
func (e *dbEvidence) rangeRecords(sealed map[recordKey]*expected, emit func(storedRecord) error) error {
	through, err := e.through()
	if err != nil {
		return err
	}
	for _, src := range sources {
		var names recordNames
		for k, exp := range sealed {
			if k.table == src.table {
				names.accounts, names.subjects, names.ids = append(names.accounts, exp.entry.AccountID),
					append(names.subjects, exp.entry.Subject), append(names.ids, k.id)
			}
		}
		var after *auditchain.Position
		if e.until.IsZero() {
			// And the records not sealed yet.
			from, ok := through[src.table]
			if !ok {
				from = auditchain.Position{XID: "0", ID: -1 << 63}
			}
			after = &from
		}
		if err := src.named(e.ctx, e.tx, names, after, stored(src, emit)); err != nil {
			return err
		}
	}
	return nil
}

// stored passes each record of src to emit as a storedRecord, with the content its hash covers.
func stored(src source, emit func(storedRecord) error) func(recordRow) error {
	return func(r recordRow) error {
		body, err := json.Marshal(src.body(r))
		if err != nil {
			return err
		}
		return emit(storedRecord{Table: src.table, ID: r.ID, Pos: auditchain.Position{XID: r.XID, ID: r.ID}, AccountID: r.AccountID,
			Subject: r.Subject, CreatedAt: r.CreatedAt, Body: body})
	}
}
