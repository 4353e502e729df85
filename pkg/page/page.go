// Package page is the keyset pagination of every list endpoint: the caller sends `limit` (1 to MaxLimit,
// DefaultLimit when absent) and the `cursor` of the page before, both in the query; the answer is
// {"items": [...], "next_cursor": "..."}, next_cursor null on the last page. A cursor is opaque to callers: it
// names the last item of a page by its sort key (created_at, id), so a page never repeats or skips an item
// because rows were added meanwhile.
//
//	r, err := page.FromQuery(req.URL.Query())     // 400 invalid_request for a bad limit or cursor
//	rows, err := store.Tickets(ctx, db, account, r)  // at most r.Limit+1 rows, after r.After
//	httpserver.JSON(c, 200, page.Of(rows, r, func(t Ticket) page.Cursor { return page.Cursor{At: t.CreatedAt, ID: t.ID} }))
package page

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"net/url"

	"github.com/retrysafe/retrysafe/pkg/jsondepth"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Limits of one page.
const (
	DefaultLimit = 50
	MaxLimit     = 100
)

// Cursor is the sort key of the last item of a page.
type Cursor struct {
	At time.Time `json:"t"`
	ID string    `json:"i"`
}

// String is the cursor as sent to callers.
func (c Cursor) String() string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

var errMalformed = errors.New("page: malformed cursor")

// Request is the page a caller asks for: at most Limit items after After (from the start when nil).
type Request struct {
	Limit int
	After *Cursor
}

// Fetch is how many rows a store reads for r: one more than the page, to know whether another page follows.
func (r Request) Fetch() int { return r.Limit + 1 }

// FromQuery reads `limit` and `cursor` from the query. A limit that is not a whole number from 1 to MaxLimit,
// or a cursor this package did not make, is 400 invalid_request naming the parameter.
func FromQuery(q url.Values) (Request, error) {
	r := Request{Limit: DefaultLimit}
	if vs, ok := q["limit"]; ok && len(vs) > 0 {
		v := vs[0]
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxLimit {
			return Request{}, &problem.Error{Code: "invalid_request",
				Detail: "limit must be a whole number from 1 to " + strconv.Itoa(MaxLimit),
				Fields: []problem.FieldError{{Field: "limit", Message: "must be a whole number from 1 to " + strconv.Itoa(MaxLimit)}}}
		}
		r.Limit = n
	}
	if vs, ok := q["cursor"]; ok && len(vs) > 0 {
		v := vs[0]
		cur, err := Parse(v)
		if err != nil {
			return Request{}, &problem.Error{Code: "invalid_request",
				Detail: "cursor is not one this list gave: send next_cursor from the page before, unchanged",
				Fields: []problem.FieldError{{Field: "cursor", Message: "is malformed"}}}
		}
		r.After = &cur
	}
	return r, nil
}

// Parse reads a cursor made by Cursor.String.
func Parse(s string) (Cursor, error) {
	var c Cursor
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Cursor{}, err
	}
	if err := jsondepth.Check(raw); err != nil {
		return Cursor{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Cursor{}, err
	}
	if c.ID == "" || len(c.ID) > 255 || problem.TextFault(c.ID, false) != "" || c.At.IsZero() {
		return Cursor{}, errMalformed
	}
	return c, nil
}

// Page is one page of a list as answered.
type Page[T any] struct {
	Items      []T     `json:"items"`
	NextCursor *string `json:"next_cursor"`
}

// Of makes the page of r from rows, read with r.Fetch(): the first r.Limit rows, and a next cursor when there
// were more.
func Of[T any](rows []T, r Request, key func(T) Cursor) Page[T] {
	if rows == nil {
		rows = []T{}
	}
	if len(rows) <= r.Limit {
		return Page[T]{Items: rows}
	}
	rows = rows[:r.Limit]
	next := key(rows[len(rows)-1]).String()
	return Page[T]{Items: rows, NextCursor: &next}
}
