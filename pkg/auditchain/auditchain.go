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
//	var c auditchain.Chain // a new chain; or auditchain.Resume(name, head)
//	c.Name = "op_123"
//	rec, err := c.Append(map[string]any{"type": "claimed", "actor": "agent:a"})
//
// Verifying: VerifyCheckpoints, then Verifier.Chain for every chain, then Verifier.Finish.
package auditchain

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

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
// Numbers are canonicalized as IEEE 754 doubles (RFC 8785): keep record numbers integers below 2^53, which is
// also what the server's SQL canonicalization reproduces exactly.
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

// LinkHash is the hash of record seq of chain, whose predecessor's hash is prev; body must already be canonical.
func LinkHash(chain string, seq int64, prev string, body []byte) string {
	buf := make([]byte, 0, len(body)+len(chain)+128)
	buf = append(buf, `{"chain":`...)
	buf = AppendString(buf, chain)
	buf = append(buf, `,"prev":"`...)
	buf = append(buf, prev...)
	buf = append(buf, `","record":`...)
	buf = append(buf, body...)
	buf = append(buf, `,"seq":`...)
	buf = strconv.AppendInt(buf, seq, 10)
	buf = append(buf, '}')
	sum := sha256.Sum256(buf)
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
	body, err := Canonical(r.Body)
	if err != nil {
		return "", err
	}
	return LinkHash(r.Chain, r.Seq, r.Prev, body), nil
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

// Append links body as the chain's next record.
func (c *Chain) Append(body any) (Record, error) {
	canon, err := Canonical(body)
	if err != nil {
		return Record{}, err
	}
	return c.AppendCanonical(canon), nil
}

// AppendCanonical links canon, a body already in canonical JSON (Canonical's output, or built to be exactly
// that), as the chain's next record.
func (c *Chain) AppendCanonical(canon []byte) Record {
	prev := c.Head()
	r := Record{Chain: c.Name, Seq: prev.Seq + 1, Prev: prev.Hash, Body: canon}
	r.Hash = LinkHash(r.Chain, r.Seq, r.Prev, canon)
	c.head = Head{Chain: c.Name, Seq: r.Seq, Hash: r.Hash}
	return r
}

// AppendString appends s to dst as RFC 8785 writes a string (section 3.2.2.2): quoted, with " and \ escaped,
// \b \t \n \f \r for those controls and \u00xx for the others, everything else as it is; invalid UTF-8 becomes
// U+FFFD, as json.Marshal makes it. It is for a writer that builds a record's canonical JSON field by field
// instead of marshalling and canonicalizing it whole (Canonical parses the JSON again); FuzzAppendString holds
// it to Canonical.
func AppendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		b := s[i]
		if b >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = utf8.AppendRune(dst, utf8.RuneError)
			} else {
				dst = append(dst, s[i:i+size]...)
			}
			i += size
			continue
		}
		switch {
		case b == '"' || b == '\\':
			dst = append(dst, '\\', b)
		case b == '\b':
			dst = append(dst, '\\', 'b')
		case b == '\t':
			dst = append(dst, '\\', 't')
		case b == '\n':
			dst = append(dst, '\\', 'n')
		case b == '\f':
			dst = append(dst, '\\', 'f')
		case b == '\r':
			dst = append(dst, '\\', 'r')
		case b < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
		default:
			dst = append(dst, b)
		}
		i++
	}
	return append(dst, '"')
}
