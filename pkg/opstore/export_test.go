package opstore

import "context"

// LookupKeySQL is lookup_key.sql, whose plan a test checks.
var LookupKeySQL = lookupKeySQL

// GroupEvent is one Append of a group.
type GroupEvent struct {
	AccountID, ID, Type, Actor string
	Detail                     any
}

// AppendGroup writes events as one group, as concurrent Appends that arrived together are written, and returns
// what each Append would return besides the group's error (a repeated attempt id's refusal).
func (g *GroupAppender) AppendGroup(ctx context.Context, events []GroupEvent) ([]error, error) {
	group := make([]groupItem, len(events))
	for i, e := range events {
		var err error
		if group[i], err = newGroupItem(e.AccountID, e.ID, e.Type, e.Actor, e.Detail); err != nil {
			return nil, err
		}
	}
	return g.insert(ctx, group)
}
