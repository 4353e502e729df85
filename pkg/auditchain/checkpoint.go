package auditchain

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Checkpoint seals the heads of the chains that moved since the previous checkpoint. Checkpoints form one chain
// of their own: Seq counts from 1 and Prev is the previous checkpoint's Hash (Genesis for the first).
type Checkpoint struct {
	Seq   int64
	Prev  string
	At    time.Time
	Heads []Head
	Hash  string
	// Signature is the base64 Ed25519 signature of Hash (its hex text), empty when unsigned.
	Signature string
}

type checkpointBody struct {
	At    string `json:"at"`
	Heads []Head `json:"heads"`
	Prev  string `json:"prev"`
	Seq   int64  `json:"seq"`
}

// Compute returns the hash cp's content should have. Heads are hashed sorted by chain name.
func (cp Checkpoint) Compute() (string, error) {
	heads := slices.Clone(cp.Heads)
	slices.SortFunc(heads, func(a, b Head) int { return strings.Compare(a.Chain, b.Chain) })
	if heads == nil {
		heads = []Head{}
	}
	body, err := Canonical(checkpointBody{At: FormatTime(cp.At), Heads: heads, Prev: cp.Prev, Seq: cp.Seq})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:]), nil
}

// NextCheckpoint builds the checkpoint after prev (nil for the first) over heads, signed when signer is not nil.
func NextCheckpoint(prev *Checkpoint, at time.Time, heads []Head, signer *Signer) (Checkpoint, error) {
	cp := Checkpoint{Seq: 1, Prev: Genesis, At: at.UTC().Truncate(time.Microsecond), Heads: heads}
	if prev != nil {
		cp.Seq, cp.Prev = prev.Seq+1, prev.Hash
	}
	slices.SortFunc(cp.Heads, func(a, b Head) int { return strings.Compare(a.Chain, b.Chain) })
	var err error
	if cp.Hash, err = cp.Compute(); err != nil {
		return Checkpoint{}, err
	}
	if signer != nil {
		cp.Signature = signer.Sign(cp.Hash)
	}
	return cp, nil
}

// Signer signs checkpoints with an Ed25519 key.
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

// Sign signs a checkpoint hash.
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

func verifySignature(pub ed25519.PublicKey, cp Checkpoint) bool {
	sig, err := base64.StdEncoding.DecodeString(cp.Signature)
	if err != nil {
		return false
	}
	return ed25519.Verify(pub, []byte(cp.Hash), sig)
}
