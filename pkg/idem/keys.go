package idem

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// The few reads of keys and operations the flow needs; the statements are in sql/. Keys are written by package
// opstatus: a key is a column of the operation it started.
var (
	//go:embed sql/lookup.sql
	lookupSQL string
	//go:embed sql/attempt_known.sql
	attemptKnownSQL string
	//go:embed sql/attempt_recorded.sql
	attemptRecordedSQL string
	//go:embed sql/lock_operation.sql
	lockOperationSQL string
	//go:embed sql/superseded.sql
	supersededSQL string
	//go:embed sql/claimed_supersedes.sql
	claimedSupersedesSQL string
)

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
	read := map[keyRef]*lookup{}
	b := &pgx.Batch{}
	for i, ref := range refs {
		if _, ok := read[ref]; ok {
			continue
		}
		l := &out[i]
		read[ref] = l
		b.Queue(lookupSQL, ref.account, ref.key).QueryRow(func(row pgx.Row) error {
			var resType, resID *string
			s := &l.stored
			err := row.Scan(&s.fingerprint, &s.operationID, &s.state, &s.response.Status, &s.response.Header,
				&s.response.Body, &s.opState, &resType, &resID)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			if resType != nil && resID != nil {
				s.resource = &opstatus.Resource{Type: *resType, ID: *resID}
			}
			l.found = err == nil
			return err
		})
	}
	if err := database.Send(ctx, db, b); err != nil {
		return nil, fmt.Errorf("idem: lookup: %w", err)
	}
	for i, ref := range refs {
		out[i] = *read[ref] // a copy of a key asked twice shares its read
	}
	return out, nil
}

// Defaults of Handler.Retention and Handler.KeyLifetime.
const (
	DefaultRetention   = 72 * time.Hour
	DefaultKeyLifetime = 90 * 24 * time.Hour
)
