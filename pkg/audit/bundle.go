package audit

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/jsondepth"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// BundleFormat names the format of an exported bundle, its first member.
const BundleFormat = "retrysafe-audit-bundle/2"

// ErrNoRecords is returned by Export for an operation with no audit records.
var ErrNoRecords = errors.New("audit: no records")

// ExportOptions choose what a bundle holds. With none set it holds the whole record.
type ExportOptions struct {
	// Since and Until, when set, bound the time range: the bundle holds the seals written in it and the records
	// they hold, and without Until the records not sealed yet.
	Since, Until time.Time
	// OperationID, when set, exports that operation's records and those of the approvals it used, with the seals
	// from the first that holds one of them to the newest (the others without their entries). It excludes Since
	// and Until.
	OperationID string
	// PublicKey, when set, is written into the bundle: the key its seals' signatures verify with.
	PublicKey string
}

// bundle is the JSON document Export writes. Each record carries the content its hash covers, so a bundle is
// checked with no database and no schema.
type bundle struct {
	Format     string       `json:"format"`
	ExportedAt time.Time    `json:"exported_at"`
	Scope      bundleScope  `json:"scope"`
	PublicKey  string       `json:"public_key,omitempty"`
	Seals      []bundleSeal `json:"seals"`
	// Through is where the newest seal ends in each table: a record at or before it that no seal holds was
	// inserted afterwards.
	Through map[string]auditchain.Position `json:"through"`
	Records []bundleRecord                 `json:"records"`
}

// bundleScope is what the bundle was exported for. With an operation, only the records of Subjects are checked
// (its seals hold other records too, which the bundle does not).
type bundleScope struct {
	Since     *time.Time `json:"since,omitempty"`
	Until     *time.Time `json:"until,omitempty"`
	Operation string     `json:"operation,omitempty"`
	Subjects  []string   `json:"subjects,omitempty"`
}

type bundleSeal struct {
	Seq         int64                          `json:"seq"`
	Prev        string                         `json:"prev_hash"`
	At          time.Time                      `json:"created_at"`
	First       int64                          `json:"first"`
	Count       int64                          `json:"count"`
	Through     map[string]auditchain.Position `json:"through"`
	RecordsHash string                         `json:"records_hash"`
	Hash        string                         `json:"hash"`
	Signature   string                         `json:"signature,omitempty"`
	// Records are the seal's entries; absent for a seal that holds none of the records in scope.
	Records json.RawMessage `json:"records,omitempty"`
}

type bundleRecord struct {
	Table     string          `json:"table"`
	ID        int64           `json:"id"`
	XID       string          `json:"xid"`
	AccountID string          `json:"account_id"`
	Subject   string          `json:"subject"`
	CreatedAt time.Time       `json:"created_at"`
	Record    json.RawMessage `json:"record"`
}

// Export writes to w, from one read-only snapshot, a bundle of the records opt selects with everything needed to
// check them: the records, the seals holding them as one unbroken run, and the public key. VerifyBundle checks it
// with the checks Verify makes. Returns ErrNoRecords for an operation with none.
func Export(ctx context.Context, db database.Pool, opt ExportOptions, w io.Writer) error {
	if opt.OperationID != "" && (!opt.Since.IsZero() || !opt.Until.IsZero()) {
		return errors.New("audit: export: an operation is exported whole, without a time range")
	}
	err := database.InTx(ctx, db, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}, func(tx *sql.Tx) error {
		ev := &dbEvidence{ctx: ctx, tx: tx, opt: VerifyOptions{Since: opt.Since, OperationID: opt.OperationID},
			until: opt.Until, run: true}
		b := bundle{Format: BundleFormat, PublicKey: opt.PublicKey, Scope: bundleScope{Operation: opt.OperationID}}
		// The database's clock, as the snapshot is taken (this is its first statement): the clock records' created_at
		// come from, and no later than any record the snapshot holds was written, so that VerifyBundle can hold the
		// records to it and judge their wait for a seal at it.
		if err := tx.QueryRowContext(ctx, `SELECT clock_timestamp()`).Scan(&b.ExportedAt); err != nil {
			return err
		}
		b.ExportedAt = b.ExportedAt.UTC()
		if !opt.Since.IsZero() {
			b.Scope.Since = &opt.Since
		}
		if !opt.Until.IsZero() {
			b.Scope.Until = &opt.Until
		}
		if opt.OperationID != "" {
			// The approvals the operation used: their records are part of its story (its timeline shows them).
			subjects, err := approvalsUsedBy(ctx, tx, opt.OperationID)
			if err != nil {
				return err
			}
			ev.opt.Subjects = subjects
			b.Scope.Subjects = ev.subjectList()
			found, err := opstore.HasEvents(ctx, tx, opt.OperationID)
			if err != nil {
				return err
			}
			if !found {
				return fmt.Errorf("%w: operation %s", ErrNoRecords, opt.OperationID)
			}
		}
		return writeBundle(ev, b, w)
	})
	if err != nil {
		if errors.Is(err, ErrNoRecords) {
			return err
		}
		return fmt.Errorf("audit: export: %w", err)
	}
	return nil
}

// writeBundle writes b's header, then what ev holds, one seal or record a line, as it is read.
func writeBundle(ev *dbEvidence, b bundle, w io.Writer) error {
	through, err := ev.through()
	if err != nil {
		return err
	}
	bw := &bundleWriter{w: bufio.NewWriter(w)}
	bw.header(b, through)
	bw.put(`,"seals":[`)
	sealed := map[recordKey]*expected{}
	if err := ev.seals(func(r sealRow) error { return bw.seal(r, sealed) }); err != nil {
		return err
	}
	bw.put("],\n\"records\":[")
	bw.n = 0
	if err := ev.records(sealed, bw.record); err != nil {
		return err
	}
	bw.put("]}\n")
	if bw.err != nil {
		return bw.err
	}
	return bw.w.Flush()
}

// bundleWriter writes a bundle piece by piece; the first write that fails stops the rest, and is its err.
type bundleWriter struct {
	w   *bufio.Writer
	err error
	// n counts the items of the list being written.
	n int
}

func (bw *bundleWriter) put(s string) {
	if bw.err == nil {
		_, bw.err = bw.w.WriteString(s)
	}
}

func (bw *bundleWriter) putJSON(v any) {
	if bw.err != nil {
		return
	}
	var raw []byte
	if raw, bw.err = json.Marshal(v); bw.err == nil {
		bw.put(string(raw))
	}
}

// item starts the next item of a list on a line of its own.
func (bw *bundleWriter) item() {
	if bw.n > 0 {
		bw.put(",\n")
	} else {
		bw.put("\n")
	}
	bw.n++
}

// header writes the members before the seals: the format first, and where the seals end.
func (bw *bundleWriter) header(b bundle, through map[string]auditchain.Position) {
	bw.put(`{"format":`)
	bw.putJSON(b.Format)
	bw.put(`,"exported_at":`)
	bw.putJSON(b.ExportedAt)
	bw.put(`,"scope":`)
	bw.putJSON(b.Scope)
	if b.PublicKey != "" {
		bw.put(`,"public_key":`)
		bw.putJSON(b.PublicKey)
	}
	bw.put(`,"through":`)
	bw.putJSON(through)
}

// seal writes one seal, and notes the records its entries hold in sealed.
func (bw *bundleWriter) seal(r sealRow, sealed map[recordKey]*expected) error {
	s, err := r.seal()
	if err != nil {
		return err
	}
	bs := bundleSeal{Seq: s.Seq, Prev: s.Prev, At: s.At.UTC(), First: s.First, Count: s.Count, Through: s.Through,
		RecordsHash: s.Records, Hash: s.Hash, Signature: s.Signature}
	if r.Records != nil {
		bs.Records = json.RawMessage(*r.Records)
		var entries []auditchain.Entry
		if err := json.Unmarshal(bs.Records, &entries); err != nil {
			return fmt.Errorf("seal %d: entries: %w", s.Seq, err)
		}
		for _, e := range entries {
			sealed[recordKey{e.Table, e.ID}] = &expected{entry: e}
		}
	}
	bw.item()
	bw.putJSON(bs)
	return nil
}

// record writes one record with the content its hash covers.
func (bw *bundleWriter) record(r storedRecord) error {
	bw.item()
	bw.putJSON(bundleRecord{Table: r.Table, ID: r.ID, XID: r.Pos.XID, AccountID: r.AccountID, Subject: r.Subject,
		CreatedAt: r.CreatedAt.UTC(), Record: r.Body})
	return nil
}

// BundleOptions narrow the check of a bundle.
type BundleOptions struct {
	// PublicKey, when set, requires every seal to carry a valid signature by its key. When nil, the
	// bundle's own key is used if it has one (BundleReport.KeyFromBundle): that proves less, since whoever
	// rewrote the bundle could have replaced the key too.
	PublicKey ed25519.PublicKey
	// Seal is VerifyOptions.Seal: the hash of a seal kept apart from the bundle.
	Seal string
}

// BundleReport is what VerifyBundle checked and found.
type BundleReport struct {
	Report
	ExportedAt time.Time
	// Operation is the operation the bundle was exported for; Since and Until its time range (zero: unbounded).
	Operation    string
	Since, Until time.Time
	// KeyFromBundle says the signatures were checked with the key the bundle carries.
	KeyFromBundle bool
}

// VerifyBundle checks a bundle written by Export, with no database, by the checks Verify makes: its seals as one
// unbroken run, then every record in its scope against them. It returns an error
// only when r is not a bundle; what is wrong with the records is in the report.
func VerifyBundle(r io.Reader, opt BundleOptions) (BundleReport, error) {
	var b bundle
	dec := json.NewDecoder(jsondepth.Reader(r))
	if err := dec.Decode(&b); err != nil {
		return BundleReport{}, fmt.Errorf("audit: bundle: %w", err)
	}
	if end := dec.InputOffset(); !errors.Is(trailing(dec), io.EOF) {
		return BundleReport{}, fmt.Errorf("audit: bundle: data after its JSON object, from byte %d: a bundle is one object", end)
	}
	if b.Format != BundleFormat {
		return BundleReport{}, fmt.Errorf("audit: bundle: format %q, want %q", b.Format, BundleFormat)
	}
	rep := BundleReport{ExportedAt: b.ExportedAt, Operation: b.Scope.Operation}
	if b.Scope.Since != nil {
		rep.Since = *b.Scope.Since
	}
	if b.Scope.Until != nil {
		rep.Until = *b.Scope.Until
	}
	pub := opt.PublicKey
	if pub == nil && b.PublicKey != "" {
		k, err := auditchain.ParsePublicKey(b.PublicKey)
		if err != nil {
			return BundleReport{}, fmt.Errorf("audit: bundle: %w", err)
		}
		pub, rep.KeyFromBundle = k, true
	}
	var err error
	whole := b.Scope.Since == nil && b.Scope.Operation == ""
	var subjects map[string]bool
	if b.Scope.Operation != "" {
		subjects = map[string]bool{b.Scope.Operation: true}
		for _, s := range b.Scope.Subjects {
			subjects[s] = true
		}
	}
	rep.Report, err = check(bundleEvidence{&b}, checkOptions{whole: whole, pub: pub, pin: opt.Seal, pinAnchors: true,
		subjects: subjects})
	if err != nil {
		return BundleReport{}, fmt.Errorf("audit: bundle: %w", err)
	}
	rep.Problems = append(rep.Problems, b.exportProblems(rep.Report)...)
	return rep, nil
}

// BundleChain is the Chain name of the problems of a bundle's own header: its export time and scope.
const BundleChain = "(bundle)"

// exportProblems checks the bundle's header against what it holds: it was exported after every record in it was
// written (both times are the database's clock), and a bundle exported with an end (--until) holds no records
// not sealed yet. Its export time is what Stalled is judged at, so it cannot be moved back before a record.
func (b *bundle) exportProblems(rep Report) []auditchain.Problem {
	var problems []auditchain.Problem
	for _, r := range b.Records {
		if at := r.writtenAt(); at.After(b.ExportedAt) {
			problems = append(problems, auditchain.Problem{Kind: auditchain.Changed, Chain: BundleChain, Ref: "exported_at",
				Detail: fmt.Sprintf("exported at %s, before %s id %d, which it holds, was written at %s",
					b.ExportedAt.UTC().Format(time.RFC3339Nano), r.Table, r.ID, at.UTC().Format(time.RFC3339Nano))})
			break
		}
	}
	if b.Scope.Until != nil && rep.Unsealed > 0 {
		problems = append(problems, auditchain.Problem{Kind: auditchain.Inserted, Chain: BundleChain, Ref: "scope",
			Detail: fmt.Sprintf("it was exported until %s, which leaves out the records not sealed yet, yet holds %d",
				b.Scope.Until.UTC().Format(time.RFC3339Nano), rep.Unsealed)})
	}
	return problems
}

// trailing reads what follows the first JSON value: io.EOF when nothing but white space does.
func trailing(dec *json.Decoder) error {
	_, err := dec.Token()
	if err == nil {
		return errors.New("more JSON")
	}
	return err
}

// bundleEvidence is a decoded bundle as evidence.
type bundleEvidence struct{ b *bundle }

func (e bundleEvidence) seals(emit func(sealRow) error) error {
	for _, s := range e.b.Seals {
		through, err := json.Marshal(s.Through)
		if err != nil {
			return err
		}
		r := sealRow{Seq: s.Seq, PrevHash: s.Prev, CreatedAt: s.At, FirstRecord: s.First, RecordCount: s.Count,
			Through: string(through), RecordsHash: s.RecordsHash, Hash: s.Hash}
		if s.Signature != "" {
			r.Signature = &s.Signature
		}
		if s.Records != nil {
			text := string(s.Records)
			r.Records = &text
		}
		if err := emit(r); err != nil {
			return err
		}
	}
	return nil
}

// through is where the bundle says the seals end, but never before where its newest seal says they end: the
// header is not signed, and a record placed before where a seal ends, yet held by none, was inserted, whatever
// the header says.
func (e bundleEvidence) through() (map[string]auditchain.Position, error) {
	through := map[string]auditchain.Position{}
	for table, at := range e.b.Through {
		through[table] = at
	}
	if n := len(e.b.Seals); n > 0 {
		for table, at := range e.b.Seals[n-1].Through {
			if cur, ok := through[table]; !ok || after(at, cur) {
				through[table] = at
			}
		}
	}
	return through, nil
}

// writtenAt is when the record was written as its content says, which its hash covers once it is sealed; the
// copy beside it when the content has none.
func (r bundleRecord) writtenAt() time.Time {
	var body struct {
		CreatedAt time.Time `json:"created_at"`
	}
	if json.Unmarshal(r.Record, &body) == nil && !body.CreatedAt.IsZero() {
		return body.CreatedAt
	}
	return r.CreatedAt
}

func (e bundleEvidence) records(_ map[recordKey]*expected, emit func(storedRecord) error) error {
	for _, r := range e.b.Records {
		rec := storedRecord{Table: r.Table, ID: r.ID, Pos: auditchain.Position{XID: r.XID, ID: r.ID}, AccountID: r.AccountID,
			Subject: r.Subject, CreatedAt: r.writtenAt(), Body: r.Record}
		if err := emit(rec); err != nil {
			return err
		}
	}
	return nil
}

// approvalsUsedBy is the ids of the approvals operation id used.
func approvalsUsedBy(ctx context.Context, tx database.DBTX, id string) ([]string, error) {
	rows, err := tx.QueryContext(ctx, `SELECT id FROM approvals WHERE used_by_operation_id = $1 ORDER BY id`, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	ids := []string{}
	for rows.Next() {
		var approval string
		if err := rows.Scan(&approval); err != nil {
			return nil, err
		}
		ids = append(ids, approval)
	}
	return ids, rows.Err()
}
