package idem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// HeaderKey is the request header that names one intended action.
const headerKey = "Idempotency-Key"

// MaxKeyLength is the longest key accepted.
const maxKeyLength = 255

// ParseKey validates an Idempotency-Key header value: present, 1 to 255 characters, printable ASCII only.
// The key is opaque: it is never trimmed, folded or interpreted.
func ParseKey(value string, present bool) (string, error) {
	if !present {
		return "", problem.New("idempotency_key_missing",
			"this write needs an Idempotency-Key header: one random value (a UUID) per intended action, reused on every retry")
	}
	if value == "" || len(value) > maxKeyLength {
		return "", problem.New("idempotency_key_invalid", "Idempotency-Key must be 1 to %d characters", maxKeyLength)
	}
	for i := 0; i < len(value); i++ {
		if value[i] < 0x20 || value[i] > 0x7e {
			return "", problem.New("idempotency_key_invalid", "Idempotency-Key must be printable ASCII")
		}
	}
	return value, nil
}

// Fingerprint is SHA-256 over the RFC 8785 canonical JSON of the method, the route template, its path
// parameters, the account and the validated command (defaults applied, amounts in minor units), in lowercase hex.
// The path parameters are part of it because the template alone does not say which resource is acted on: one key
// used to capture two different intents must be a conflict, not a replay. Two requests that mean the same
// thing have one fingerprint whatever their key order, spacing or equivalent spelling of an amount.
//
// The command is marshalled by encoding/json first (auditchain.Canonical), so the canonicalizer only ever sees
// complete, valid JSON: some canonicalizers accept truncated input, and a fingerprint of half a request would be
// worse than none.
func Fingerprint(method, route string, params map[string]string, accountID string, command any) (string, error) {
	if params == nil {
		params = map[string]string{}
	}
	canonical, err := auditchain.Canonical(struct {
		Method    string            `json:"method"`
		Route     string            `json:"route"`
		Params    map[string]string `json:"params"`
		AccountID string            `json:"account_id"`
		Command   any               `json:"command"`
	}{method, route, params, accountID, command})
	if err != nil {
		return "", fmt.Errorf("idem: fingerprint: %w", err)
	}
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:]), nil
}

// stored is a claimed key as read back.
type stored struct {
	fingerprint string
	operationID string
	// state is the key's: running, completed (response is set) or expired (the response was pruned).
	state    string
	response response
	// resource is the operation's: what an expired key's answer names.
	resource *opstatus.Resource
	// opState is the state of the key's operation when the key was read.
	opState opstatus.State
}

func (s stored) completed() bool { return s.state == "completed" }
func (s stored) expired() bool   { return s.state == "expired" }

// response is what a completed key replays, byte for byte.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

// keyRef names one key; lookup is what reading it found.
type keyRef struct{ account, key string }

type lookup struct {
	stored
	found bool
}

// lookupKeys reads keys in one round trip, one statement per distinct key (each keeps its generic plan).
func lookupKeys(ctx context.Context, db *gorm.DB, refs []keyRef) ([]lookup, error) {
	out := make([]lookup, len(refs))
	keys := make([]opstore.Key, len(refs))
	read := map[keyRef]*lookup{}
	b := &pgx.Batch{}
	for i, ref := range refs {
		if _, ok := read[ref]; ok {
			continue
		}
		l := &out[i]
		read[ref] = l
		opstore.QueueLookupKey(b, ref.account, ref.key, &keys[i], &l.found)
	}
	if err := database.Send(ctx, db, b); err != nil {
		return nil, fmt.Errorf("idem: lookup: %w", err)
	}
	for i, k := range keys {
		if l := &out[i]; l.found {
			l.stored = storedKey(k)
		}
	}
	for i, ref := range refs {
		out[i] = *read[ref] // a copy of a key asked twice shares its read
	}
	return out, nil
}

// storedKey is k as the flow reads it.
func storedKey(k opstore.Key) stored {
	s := stored{fingerprint: k.Fingerprint, operationID: k.OperationID, state: k.State,
		response: response{Status: k.Status, Header: k.Header, Body: k.Body}, opState: opstatus.State(k.OperationState)}
	if k.ResourceType != nil && k.ResourceID != nil {
		s.resource = &opstatus.Resource{Type: *k.ResourceType, ID: *k.ResourceID}
	}
	return s
}

// Defaults of Handler.Retention and Handler.KeyLifetime.
const (
	defaultRetention   = 72 * time.Hour
	defaultKeyLifetime = 90 * 24 * time.Hour
)
