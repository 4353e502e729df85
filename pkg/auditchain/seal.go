package auditchain

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"strings"
	"time"
)

// Seal vouches for one batch of records. Seals form one chain: Seq counts from 1, Prev is the previous seal's
// Hash (Genesis for the first), and First numbers the batch's first record in the order of all sealed records
// (1 for the first seal's, then the previous seal's First plus its Count), so a seal removed from the middle or
// the end of the chain, or a batch cut short, shows.
type Seal struct {
	Seq   int64
	Prev  string
	At    time.Time
	First int64
	Count int64
	// Through says where the batch ends in each table of records it takes from, as the sequencer reads them.
	Through map[string]Position
	// Records is RecordsHash of the batch's entries.
	Records string
	Hash    string
	// Signature is the base64 Ed25519 signature of Hash (its hex text), empty when unsigned.
	Signature string
}

// Position is a record's place in the order records are sealed in: its writing transaction's id (PostgreSQL's
// xid8, as decimal text), then its id.
type Position struct {
	XID string `json:"xid"`
	ID  int64  `json:"id"`
}

// Entry is one record of a seal's batch: which record of which subject, and RecordHash of its content.
type Entry struct {
	Table     string `json:"table"`
	ID        int64  `json:"id"`
	AccountID string `json:"account_id"`
	Subject   string `json:"subject"`
	Hash      string `json:"hash"`
}

type sealBody struct {
	At      string              `json:"at"`
	Count   int64               `json:"count"`
	First   int64               `json:"first"`
	Prev    string              `json:"prev"`
	Records string              `json:"records"`
	Seq     int64               `json:"seq"`
	Through map[string]Position `json:"through"`
}

// Compute returns the hash s's content should have: the SHA-256 of the canonical JSON of every field but Hash
// and Signature. The entries enter through Records, so a seal is checked, and links, without them.
func (s Seal) Compute() (string, error) {
	through := s.Through
	if through == nil {
		through = map[string]Position{}
	}
	body, err := Canonical(sealBody{At: FormatTime(s.At), Count: s.Count, First: s.First, Prev: s.Prev, Records: s.Records,
		Seq: s.Seq, Through: through})
	if err != nil {
		return "", err
	}
	return hashOf(body), nil
}

// RecordHash is the hash of one record's content: the SHA-256 of its canonical JSON.
func RecordHash(body any) (string, error) {
	canon, err := Canonical(body)
	if err != nil {
		return "", err
	}
	return hashOf(canon), nil
}

// RecordsHash is the hash of a batch's entries, in order: the SHA-256 of their canonical JSON (an array).
// entries is a []Entry or its JSON text (json.RawMessage).
func RecordsHash(entries any) (string, error) {
	if e, ok := entries.([]Entry); ok && e == nil {
		entries = []Entry{}
	}
	return RecordHash(entries)
}

// NextSeal builds the seal after prev (nil for the first) over entries, signed when signer is not nil.
func NextSeal(prev *Seal, at time.Time, entries []Entry, through map[string]Position, signer *Signer) (Seal, error) {
	s := Seal{Seq: 1, Prev: Genesis, First: 1, At: at.UTC().Truncate(time.Microsecond), Count: int64(len(entries)), Through: through}
	if prev != nil {
		s.Seq, s.Prev, s.First = prev.Seq+1, prev.Hash, prev.First+prev.Count
	}
	var err error
	if s.Records, err = RecordsHash(entries); err != nil {
		return Seal{}, err
	}
	if s.Hash, err = s.Compute(); err != nil {
		return Seal{}, err
	}
	if signer != nil {
		s.Signature = signer.Sign(s.Hash)
	}
	return s, nil
}

// VerifySeal checks one seal on its own: its hash and, when pub is not nil, its signature.
func VerifySeal(s Seal, pub ed25519.PublicKey) *Problem {
	bad := func(k Kind, detail string) *Problem {
		return &Problem{Kind: k, Chain: SealChain, Seq: s.Seq, Ref: fmt.Sprintf("seal %d", s.Seq), Detail: detail}
	}
	h, err := s.Compute()
	switch {
	case err != nil || h != s.Hash:
		return bad(Changed, "its content does not match its hash")
	case pub != nil && s.Signature == "":
		return bad(BadSignature, "it is not signed")
	case pub != nil && !verifySignature(pub, s):
		return bad(BadSignature, "its signature does not verify with the given public key")
	}
	return nil
}

// VerifySealChain checks a run of seals in stored order: each on its own (VerifySeal), then seq, prev and first
// against the one before. The first seal's links are trusted when its Seq is above 1 (a partial run). It returns
// the first problem, if any.
func VerifySealChain(seals []Seal, pub ed25519.PublicKey) *Problem {
	for i, s := range seals {
		bad := func(k Kind, format string, args ...any) *Problem {
			return &Problem{Kind: k, Chain: SealChain, Seq: s.Seq, Ref: fmt.Sprintf("seal %d", s.Seq), Detail: fmt.Sprintf(format, args...)}
		}
		if p := VerifySeal(s, pub); p != nil {
			return p
		}
		if i == 0 {
			if s.Seq == 1 && (s.Prev != Genesis || s.First != 1) {
				return bad(Changed, "the first seal does not start from genesis")
			}
			continue
		}
		before := seals[i-1]
		switch {
		case s.Seq > before.Seq+1:
			return bad(Missing, "seals %d to %d are missing", before.Seq+1, s.Seq-1)
		case s.Seq != before.Seq+1:
			return bad(OutOfOrder, "stored after seal %d", before.Seq)
		case s.Prev != before.Hash:
			return bad(Changed, "it does not link to seal %d: one of them was rewritten", before.Seq)
		case s.First != before.First+before.Count:
			return bad(Changed, "its records do not follow seal %d's", before.Seq)
		}
	}
	return nil
}

// Signer signs seals with an Ed25519 key.
type Signer struct {
	key ed25519.PrivateKey
}

// ParseSigningKey reads an Ed25519 seed (32 bytes) in standard base64, the form of AUDIT_SIGNING_KEY.
func ParseSigningKey(b64 string) (*Signer, error) {
	seed, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
	if err != nil {
		return nil, fmt.Errorf("auditchain: signing key: not base64")
	}
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("auditchain: signing key: want a %d-byte Ed25519 seed, got %d bytes", ed25519.SeedSize, len(seed))
	}
	return &Signer{key: ed25519.NewKeyFromSeed(seed)}, nil
}

// Sign signs a seal's hash.
func (s *Signer) Sign(hash string) string {
	return base64.StdEncoding.EncodeToString(ed25519.Sign(s.key, []byte(hash)))
}

// PublicKey is the key auditors verify with, in standard base64.
func (s *Signer) PublicKey() string {
	return base64.StdEncoding.EncodeToString(s.key.Public().(ed25519.PublicKey))
}

// ParsePublicKey reads a public key printed by Signer.PublicKey.
func ParsePublicKey(b64 string) (ed25519.PublicKey, error) {
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("auditchain: public key: want %d bytes in base64", ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(raw), nil
}

func verifySignature(pub ed25519.PublicKey, s Seal) bool {
	sig, err := base64.StdEncoding.DecodeString(s.Signature)
	if err != nil {
		return false
	}
	return ed25519.Verify(pub, []byte(s.Hash), sig)
}
