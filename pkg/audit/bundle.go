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
	"slices"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

// BundleFormat names the format of an exported bundle, its first member.
const BundleFormat = "retrysafe-audit-bundle/1"

// ErrNoRecords is returned by Export for an operation with no audit records.
var ErrNoRecords = errors.New("audit: no records")

// ExportOptions choose what a bundle holds. With none set it holds the whole record.
type ExportOptions struct {
	// Since and Until, when set, bound the time range: the bundle holds the checkpoints written in it and every
	// chain with a record written in it or sealed by one of those checkpoints.
	Since, Until time.Time
	// OperationID, when set, exports that operation's chain and those of the approvals it used, with the
	// checkpoints from the first that sealed one of them to the newest. It excludes Since and Until.
	OperationID string
	// PublicKey, when set, is written into the bundle: the key its checkpoints' signatures verify with.
	PublicKey string
}

// bundle is the JSON document Export writes. Chains hold whole chains (every record from seq 1) in stored order,
// each record with the content its hash covers, so a bundle is checked with no database and no schema.
type bundle struct {
	Format      string             `json:"format"`
	ExportedAt  time.Time          `json:"exported_at"`
	Scope       bundleScope        `json:"scope"`
	PublicKey   string             `json:"public_key,omitempty"`
	Checkpoints []bundleCheckpoint `json:"checkpoints"`
	Heads       []auditchain.Head  `json:"heads"`
	Chains      []bundleChain      `json:"chains"`
}

// bundleScope is what the bundle was exported for. With an operation, only Chains are checked (its checkpoints
// seal other chains too, which the bundle does not hold); otherwise every chain a checkpoint or head names.
type bundleScope struct {
	Since     *time.Time `json:"since,omitempty"`
	Until     *time.Time `json:"until,omitempty"`
	Operation string     `json:"operation,omitempty"`
	Chains    []string   `json:"chains,omitempty"`
}

type bundleCheckpoint struct {
	Seq       int64           `json:"seq"`
	Prev      string          `json:"prev_hash"`
	At        time.Time       `json:"created_at"`
	Heads     json.RawMessage `json:"heads"`
	Hash      string          `json:"hash"`
	Signature string          `json:"signature,omitempty"`
}

type bundleChain struct {
	Chain   string         `json:"chain"`
	Records []bundleRecord `json:"records"`
}

type bundleRecord struct {
	Ref    string          `json:"ref"`
	Seq    int64           `json:"seq"`
	Prev   string          `json:"prev_hash"`
	Hash   string          `json:"hash"`
	Record json.RawMessage `json:"record"`
}

// Export writes to w, from one read-only snapshot, a bundle of the records opt selects with everything needed to
// check them: whole chains, the checkpoints covering them as one unbroken run, the chains' heads and the public
// key. VerifyBundle checks it with the checks Verify makes. Returns ErrNoRecords for an operation with none.
func Export(ctx context.Context, db *gorm.DB, opt ExportOptions, w io.Writer) error {
	if opt.OperationID != "" && (!opt.Since.IsZero() || !opt.Until.IsZero()) {
		return errors.New("audit: export: an operation is exported whole, without a time range")
	}
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		ev := &dbEvidence{ctx: ctx, tx: tx, opt: VerifyOptions{Since: opt.Since, OperationID: opt.OperationID},
			until: opt.Until, run: true}
		b := bundle{Format: BundleFormat, ExportedAt: time.Now().UTC(), PublicKey: opt.PublicKey,
			Scope: bundleScope{Operation: opt.OperationID}}
		if !opt.Since.IsZero() {
			b.Scope.Since = &opt.Since
		}
		if !opt.Until.IsZero() {
			b.Scope.Until = &opt.Until
		}
		if opt.OperationID != "" {
			// The approvals the operation used: their chains are part of its story (its timeline shows them).
			if err := tx.Raw(`SELECT id FROM approvals WHERE used_by_operation_id = ? ORDER BY id`, opt.OperationID).
				Scan(&ev.opt.Chains).Error; err != nil {
				return err
			}
			b.Scope.Chains = ev.chainNames()
		}
		return writeBundle(ev, b, w)
	}, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		if errors.Is(err, ErrNoRecords) {
			return err
		}
		return fmt.Errorf("audit: export: %w", err)
	}
	return nil
}

// writeBundle writes b's header, then what ev holds, one checkpoint, head or chain a line, as it is read.
func writeBundle(ev *dbEvidence, b bundle, w io.Writer) error {
	rows, err := ev.checkpoints()
	if err != nil {
		return err
	}
	// Every chain a checkpoint sealed is in scope: a bundle that lost one of them must fail its check.
	want := map[string]auditchain.Expectation{}
	for _, r := range rows {
		var heads []auditchain.Head
		if json.Unmarshal([]byte(r.Heads), &heads) == nil {
			for _, h := range heads {
				want[h.Chain] = auditchain.Expectation{Head: h}
			}
		}
	}
	names, scoped, err := ev.scope(want)
	if err != nil {
		return err
	}
	heads, err := ev.heads(scoped, names)
	if err != nil {
		return err
	}
	if b.Scope.Operation != "" {
		var found []int64
		if err := ev.tx.Raw(`SELECT 1 FROM operation_events WHERE operation_id = ? LIMIT 1`, b.Scope.Operation).Scan(&found).Error; err != nil {
			return err
		}
		if len(found) == 0 {
			return fmt.Errorf("%w: operation %s", ErrNoRecords, b.Scope.Operation)
		}
	}

	bw := bufio.NewWriter(w)
	var werr error
	put := func(s string) {
		if werr == nil {
			_, werr = bw.WriteString(s)
		}
	}
	putJSON := func(v any) {
		if werr != nil {
			return
		}
		var raw []byte
		if raw, werr = json.Marshal(v); werr == nil {
			put(string(raw))
		}
	}
	list := func(i int) {
		if i > 0 {
			put(",\n")
		} else {
			put("\n")
		}
	}
	put(`{"format":`)
	putJSON(b.Format)
	put(`,"exported_at":`)
	putJSON(b.ExportedAt)
	put(`,"scope":`)
	putJSON(b.Scope)
	if b.PublicKey != "" {
		put(`,"public_key":`)
		putJSON(b.PublicKey)
	}
	put(`,"checkpoints":[`)
	for i, r := range rows {
		list(i)
		sig := ""
		if r.Signature != nil {
			sig = *r.Signature
		}
		putJSON(bundleCheckpoint{Seq: r.Seq, Prev: r.PrevHash, At: r.CreatedAt.UTC(), Heads: json.RawMessage(r.Heads),
			Hash: r.Hash, Signature: sig})
	}
	put("],\n\"heads\":[")
	for i, h := range heads {
		list(i)
		putJSON(h)
	}
	put("],\n\"chains\":[")
	n := 0 // chains written
	err = ev.chains(scoped, names, func(name string, recs []auditchain.Record) {
		c := bundleChain{Chain: name, Records: make([]bundleRecord, len(recs))}
		for i, r := range recs {
			c.Records[i] = bundleRecord{Ref: r.Ref, Seq: r.Seq, Prev: r.Prev, Hash: r.Hash, Record: r.Body}
		}
		list(n)
		n++
		putJSON(c)
	})
	if err != nil {
		return err
	}
	put("]}\n")
	if werr != nil {
		return werr
	}
	return bw.Flush()
}

// BundleOptions narrow the check of a bundle.
type BundleOptions struct {
	// PublicKey, when set, requires every checkpoint to carry a valid signature by its key. When nil, the
	// bundle's own key is used if it has one (BundleReport.KeyFromBundle): that proves less, since whoever
	// rewrote the bundle could have replaced the key too.
	PublicKey ed25519.PublicKey
	// Checkpoint is VerifyOptions.Checkpoint: the hash of a checkpoint kept apart from the bundle.
	Checkpoint string
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

// VerifyBundle checks a bundle written by Export, with no database, by the checks Verify makes: its checkpoints
// as one unbroken run, then every chain in its scope against them and against its heads. It returns an error
// only when r is not a bundle; what is wrong with the records is in the report.
func VerifyBundle(r io.Reader, opt BundleOptions) (BundleReport, error) {
	var b bundle
	dec := json.NewDecoder(r)
	if err := dec.Decode(&b); err != nil {
		return BundleReport{}, fmt.Errorf("audit: bundle: %w", err)
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
	rep.Report, err = check(bundleEvidence{&b}, checkOptions{whole: whole, pub: pub, pin: opt.Checkpoint})
	if err != nil {
		return BundleReport{}, fmt.Errorf("audit: bundle: %w", err)
	}
	return rep, nil
}

// bundleEvidence is a decoded bundle as evidence.
type bundleEvidence struct{ b *bundle }

func (e bundleEvidence) checkpoints() ([]checkpointRow, error) {
	rows := make([]checkpointRow, len(e.b.Checkpoints))
	for i, cp := range e.b.Checkpoints {
		rows[i] = checkpointRow{Seq: cp.Seq, PrevHash: cp.Prev, CreatedAt: cp.At, Heads: string(cp.Heads), Hash: cp.Hash}
		if cp.Signature != "" {
			rows[i].Signature = &cp.Signature
		}
	}
	return rows, nil
}

func (e bundleEvidence) scope(map[string]auditchain.Expectation) ([]string, bool, error) {
	if e.b.Scope.Operation != "" {
		names := slices.Clone(e.b.Scope.Chains)
		if !slices.Contains(names, e.b.Scope.Operation) {
			names = append(names, e.b.Scope.Operation)
		}
		return names, true, nil
	}
	return nil, false, nil
}

func (e bundleEvidence) heads(scoped bool, names []string) ([]auditchain.Head, error) {
	var heads []auditchain.Head
	for _, h := range e.b.Heads {
		if !scoped || slices.Contains(names, h.Chain) {
			heads = append(heads, h)
		}
	}
	return heads, nil
}

func (e bundleEvidence) chains(scoped bool, names []string, emit func(string, []auditchain.Record)) error {
	for _, c := range e.b.Chains {
		if scoped && !slices.Contains(names, c.Chain) {
			continue
		}
		recs := make([]auditchain.Record, len(c.Records))
		for i, r := range c.Records {
			recs[i] = auditchain.Record{Chain: c.Chain, Seq: r.Seq, Prev: r.Prev, Hash: r.Hash, Body: r.Record, Ref: r.Ref}
		}
		emit(c.Chain, recs)
	}
	return nil
}
