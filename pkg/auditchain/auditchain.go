// Package auditchain is the tamper-evident format of retrysafe's audit records and its verification, with no
// storage attached: the server seals its records in PostgreSQL (package audit), an agent's journal chains its
// own in a file, and both are checked by this code. Every hash is a SHA-256 over RFC 8785 canonical JSON
// (Canonical), hex-encoded.
//
// Seals (the server). A seal vouches for one batch of records: each Entry names a record and carries
// RecordHash of its content; the seal carries RecordsHash of the entries, where its batch ends (Through), the
// batch's first ordinal and count, and the previous seal's hash, and may be signed with Ed25519:
//
//	hash(seal) = hex(SHA-256(JCS({"at", "count", "first", "prev": hash(previous seal), "records": RecordsHash(entries), "seq", "through"})))
//
// A record changed, removed or swapped with another no longer matches the entry that names it; a seal removed,
// changed or forged breaks the chain of seals, or its signature when the forger lacks the signing key.
//
// Chains (an agent's journal). Record n of a chain links to record n-1 by hash:
//
//	hash(n) = hex(SHA-256(JCS({"chain": chain, "prev": hash(n-1), "record": body(n), "seq": n})))
//
// where hash(0) is Genesis. Changing any record, deleting one, inserting one or reordering them breaks a link.
//
// Writing a chain:
//
//	var c auditchain.Chain // a new chain; or auditchain.Resume(head) to continue one
//	c.Name = "jnl_123"
//	rec, err := c.Append(map[string]any{"type": "claimed", "actor": "agent:a"})
//
// Verifying: Verifier.Chain for every chain; VerifySealChain for a run of seals, then each record against its
// entry (package audit).
package auditchain

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/go-json-experiment/json/jsontext"
)

// Genesis is the prev hash of a chain's first record and of the first seal.
const Genesis = "0000000000000000000000000000000000000000000000000000000000000000"

// TimeFormat is how times appear inside hashed records: UTC, microseconds (PostgreSQL's precision).
const TimeFormat = "2006-01-02T15:04:05.000000Z"

// FormatTime renders t as TimeFormat.
func FormatTime(t time.Time) string {
	return t.UTC().Truncate(time.Microsecond).Format(TimeFormat)
}

// Canonical returns the RFC 8785 canonical JSON of v. A json.RawMessage or []byte is taken as JSON text. The
// canonicalizer is jsontext.Value.Canonicalize (github.com/go-json-experiment/json, the encoding/json/v2
// prototype), which reformats the text in place.
//
// It is the one canonicalization of records: the sequencer that seals them and every verifier go through it.
// RFC 8785 writes a number as the IEEE 754 double nearest to it, so a number that no double holds
// exactly would be recorded as another one: ExactNumber tells, and the API refuses those at its edge.
func Canonical(v any) ([]byte, error) {
	var out jsontext.Value
	switch b := v.(type) {
	case json.RawMessage:
		out = bytes.Clone(b) // canonicalized in place: never the caller's bytes
	case []byte:
		out = bytes.Clone(b)
	default:
		var err error
		if out, err = json.Marshal(v); err != nil {
			return nil, fmt.Errorf("auditchain: canonical: %w", err)
		}
	}
	if err := out.Canonicalize(); err != nil {
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

// Head is the last record of a chain.
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
