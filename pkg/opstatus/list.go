package opstatus

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstore"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// ListFilter selects the operations List returns.
type ListFilter struct {
	// State and Kind, when set, keep only operations in that state or of that kind.
	State State
	Kind  string
	// After is the Next cursor of the previous page ("" for the first page).
	After string
	// Limit is the page size (50 when zero, at most 200).
	Limit int
}

// Page is one page of List: operations without their events, and the cursor of the next page ("" on the last).
type Page struct {
	Operations []Operation
	Next       string
}

// listCursor is the place of the last operation of a page in List's order.
type listCursor struct {
	Unknown   bool      `json:"u"`
	CreatedAt time.Time `json:"c"`
	ID        string    `json:"i"`
}

// List returns a page of account's operations: unknown ones first (they wait for a person), then newest first.
// Pages are keyset-paginated on the operations_account_listing index, so the hundredth page costs what the
// first does. Returns a validation problem for a cursor it did not issue.
func List(ctx context.Context, db database.DBTX, accountID string, f ListFilter) (Page, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 50
	}
	limit = min(limit, 200)
	var after *opstore.ListAfter
	if f.After != "" {
		var cur listCursor
		raw, err := base64.RawURLEncoding.DecodeString(f.After)
		if err == nil {
			err = json.Unmarshal(raw, &cur)
		}
		if err != nil || cur.ID == "" {
			return Page{}, problem.Validation(problem.FieldError{Field: "after", Message: "is not a cursor of this list"})
		}
		after = &opstore.ListAfter{Unknown: cur.Unknown, CreatedAt: cur.CreatedAt, ID: cur.ID}
	}
	rows, err := opstore.List(ctx, db, accountID, string(f.State), f.Kind, after, limit+1)
	if err != nil {
		return Page{}, err
	}
	var p Page
	for i, r := range rows {
		if i == limit {
			last := p.Operations[limit-1]
			raw, err := json.Marshal(listCursor{Unknown: last.State == StateUnknown, CreatedAt: last.CreatedAt, ID: last.ID})
			if err != nil {
				return Page{}, fmt.Errorf("opstatus: list cursor: %w", err)
			}
			p.Next = base64.RawURLEncoding.EncodeToString(raw)
			break
		}
		p.Operations = append(p.Operations, operation(r))
	}
	return p, nil
}
