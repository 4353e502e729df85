// Package auditchain is the tamper-evident format of retrysafe's audit records and its verification, with no
// storage attached: the server keeps its chains in PostgreSQL (package audit), an agent's journal may keep them
// in a file, and both are checked by the same code.
//
// A chain is the ordered history of one subject (an operation, an approval). Record n of a chain links to
// record n-1 by hash:
//
//	hash(n) = hex(SHA-256(JCS({"chain": chain, "prev": hash(n-1), "record": body(n), "seq": n})))
//
// where JCS is RFC 8785 canonical JSON and hash(0) is Genesis. Changing any record, deleting one, inserting one
// or reordering them breaks a link. What a chain alone cannot show is that its tail or the whole chain was
// removed: Checkpoints cover that. A checkpoint hashes the previous checkpoint with the heads (last seq and
// hash) of every chain that moved since, as CloudTrail's digest files do, and may be signed with Ed25519.
//
// Without a signature the format catches edits by anyone who does not recompute the hashes; with one, also by
// someone who can write to the store but lacks the signing key.
//
// Writing a chain:
//
//	var c auditchain.Chain // a new chain; or auditchain.Resume(head) to continue one
//	c.Name = "op_123"
//	rec, err := c.Append(map[string]any{"type": "claimed", "actor": "agent:a"})
//
// Verifying: VerifyCheckpoints, then Verifier.Chain for every chain, then Verifier.Finish.
package auditchain

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/gowebpki/jcs"
)

// Genesis is the prev hash of a chain's first record and of the first checkpoint.
const Genesis = "0000000000000000000000000000000000000000000000000000000000000000"

// TimeFormat is how times appear inside hashed records: UTC, microseconds (PostgreSQL's precision).
const TimeFormat = "2006-01-02T15:04:05.000000Z"

// FormatTime renders t as TimeFormat.
func FormatTime(t time.Time) string {
	return t.UTC().Truncate(time.Microsecond).Format(TimeFormat)
}

// Canonical returns the RFC 8785 canonical JSON of v. A json.RawMessage or []byte is taken as JSON text.
//
// It is the one canonicalization of records in Go: every writer that links records and every verifier goes
// through it (the database's triggers follow the same rules in SQL, held to this by a fuzz test in package
// audit). RFC 8785 writes a number as the IEEE 754 double nearest to it, so a number that no double holds
// exactly would be recorded as another one: ExactNumber tells, and the API refuses those at its edge.
func Canonical(v any) ([]byte, error) {
	var raw []byte
	switch b := v.(type) {
	case json.RawMessage:
		raw = b
	case []byte:
		raw = b
	default:
		var err error
		if raw, err = json.Marshal(v); err != nil {
			return nil, fmt.Errorf("auditchain: canonical: %w", err)
		}
	}
	out, err := jcs.Transform(raw)
	if err != nil {
		return nil, fmt.Errorf("auditchain: canonical: %w", err)
	}
	return out, nil
}

// link is what a record's hash covers: the record and its place in its chain.
type link struct {
	Chain  string `json:"chain"`
	Prev   string `json:"prev"`
	Record any    `json:"record"`
	Seq    int64  `json:"seq"`
}

// canonicalLink is the canonical JSON of record seq of chain, whose predecessor's hash is prev, and the
// record's own canonical JSON within it: the members of a link sort as chain, prev, record, seq, so the record
// lies between the first `","record":` (a quote inside a string is escaped, so neither the chain's name nor
// prev holds one) and the closing `,"seq":N}`. One canonicalization serves both.
func canonicalLink(chain string, seq int64, prev string, record any) (canon, body []byte, err error) {
	canon, err = Canonical(link{Chain: chain, Prev: prev, Record: record, Seq: seq})
	if err != nil {
		return nil, nil, err
	}
	const before = `","record":`
	after := `,"seq":` + strconv.FormatInt(seq, 10) + `}`
	start := bytes.Index(canon, []byte(before)) + len(before)
	if start < len(before) || !bytes.HasSuffix(canon, []byte(after)) || start > len(canon)-len(after) {
		return nil, nil, fmt.Errorf("auditchain: the canonical link of %s seq %d is not the expected shape", chain, seq)
	}
	end := len(canon) - len(after)
	return canon, canon[start:end:end], nil
}

func hashOf(canon []byte) string {
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:])
}

// Record is one link of a chain as stored.
type Record struct {
	Chain string
	Seq   int64
	Prev  string
	Hash  string
	// Body is the record's content (any JSON; canonicalized before hashing).
	Body json.RawMessage
	// Ref says where the record is stored ("operation_events id 17"), for reports.
	Ref string
}

// Compute returns the hash that r's content and links should have.
func (r Record) Compute() (string, error) {
	canon, _, err := canonicalLink(r.Chain, r.Seq, r.Prev, r.Body)
	if err != nil {
		return "", err
	}
	return hashOf(canon), nil
}

// Head is the last record of a chain: what checkpoints cover.
type Head struct {
	Chain string `json:"chain"`
	Seq   int64  `json:"seq"`
	Hash  string `json:"hash"`
}

// Chain appends records to one chain in memory; the caller stores what Append returns.
type Chain struct {
	Name string
	head Head
}

// Resume continues a chain whose last stored record is head.
func Resume(head Head) *Chain {
	return &Chain{Name: head.Chain, head: head}
}

// Head is the chain's last record (seq 0 and Genesis when empty).
func (c *Chain) Head() Head {
	h := c.head
	h.Chain = c.Name
	if h.Hash == "" {
		h.Hash = Genesis
	}
	return h
}

// Append links body as the chain's next record. The record's Body is body's canonical JSON.
func (c *Chain) Append(body any) (Record, error) {
	prev := c.Head()
	r := Record{Chain: c.Name, Seq: prev.Seq + 1, Prev: prev.Hash}
	canon, rec, err := canonicalLink(r.Chain, r.Seq, r.Prev, body)
	if err != nil {
		return Record{}, err
	}
	r.Body, r.Hash = rec, hashOf(canon)
	c.head = Head{Chain: c.Name, Seq: r.Seq, Hash: r.Hash}
	return r, nil
}
