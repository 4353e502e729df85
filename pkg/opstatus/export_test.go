package opstatus

import "context"

// GroupEvent is one Append of a group.
type GroupEvent struct {
	AccountID, ID, Type, Actor string
	Detail                     any
}

// AppendGroup writes events as one group, as concurrent Appends that arrived together are written.
func (g *GroupAppender) AppendGroup(ctx context.Context, events []GroupEvent) error {
	group := make([]groupItem, len(events))
	for i, e := range events {
		var err error
		if group[i], err = newGroupItem(e.AccountID, e.ID, e.Type, e.Actor, e.Detail); err != nil {
			return err
		}
	}
	_, err := g.insert(ctx, group)
	return err
}
