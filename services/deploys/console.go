package deploys

import (
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/pkg/console"
)

var _ service.ConsolePages = (*Service)(nil)

const (
	consoleEnvironmentsPage = 50
	consoleRecentDeploys    = 20
)

// ConsolePages implements service.ConsolePages: the account's environments, and each one's version, current
// deploy, lock holder with its lease, and recent deploys.
func (s *Service) ConsolePages() []console.Page {
	return []console.Page{
		{Path: "/environments", Nav: "Environments", Render: s.environmentsPage},
		{Path: "/environments/{name}", Render: s.environmentPage},
	}
}

func (s *Server) environmentsPage(r console.Request) (console.View, error) {
	envs, err := s.Store.Environments(r.Context, s.DB, r.AccountID, r.Query("after"), consoleEnvironmentsPage+1)
	if err != nil {
		return console.View{}, err
	}
	t := &console.Table{Columns: []string{"Environment", "Version", "Current deploy", "Running", "Lock holder", "Lease until"}}
	for i, e := range envs {
		if i == consoleEnvironmentsPage {
			t.Next = console.Prefix + "/environments?after=" + url.QueryEscape(envs[i-1].Name)
			break
		}
		holder, lease := console.Cell{Text: "free"}, console.Cell{Text: "—"}
		if e.Lock != nil {
			holder = deployCell(e.Lock.HolderDeployID)
			lease.Text = leaseText(e.Lock.LeaseExpiresAt)
		}
		t.Rows = append(t.Rows, []console.Cell{
			{Text: e.Name, Link: environmentLink(e.Name)}, {Text: strconv.FormatInt(e.Version, 10)},
			optionalDeployCell(e.CurrentDeployID), {Text: running(e), Mono: true}, holder, lease,
		})
	}
	return console.View{Title: "Environments", Sections: []console.Section{
		{Table: t, Empty: "No environment yet: one comes into being with its first deploy."},
	}}, nil
}

func (s *Server) environmentPage(r console.Request) (console.View, error) {
	e, err := s.Store.Environment(r.Context, s.DB, r.AccountID, r.Param("name"))
	if err != nil {
		return console.View{}, err
	}
	recent, err := s.Store.RecentDeploys(r.Context, s.DB, r.AccountID, e.Name, consoleRecentDeploys)
	if err != nil {
		return console.View{}, err
	}
	current := console.Section{Title: "Now", Fields: []console.Field{
		{Label: "Version", Value: strconv.FormatInt(e.Version, 10)},
		{Label: "Running", Value: running(e)},
		deployField("Current deploy", e.CurrentDeployID),
		deployField("Rollback would return to", e.PreviousDeployID),
		{Label: "Updated", Value: e.UpdatedAt.UTC().Format(time.DateTime + " UTC")},
	}}
	lock := console.Section{Title: "Release lock", Fields: []console.Field{{Label: "Holder", Value: "free: no deploy holds it"}}}
	if e.Lock != nil {
		lock.Fields = []console.Field{
			{Label: "Holder", Value: e.Lock.HolderDeployID},
			{Label: "Fencing token", Value: strconv.FormatInt(e.Lock.FencingToken, 10)},
			{Label: "Acquired", Value: e.Lock.AcquiredAt.UTC().Format(time.DateTime + " UTC")},
			{Label: "Lease until", Value: leaseText(e.Lock.LeaseExpiresAt)},
		}
	}
	t := &console.Table{Columns: []string{"Deploy", "Kind", "Service", "Reference", "State", "Steps", "Planned on version", "Created", "Operation"}}
	for _, d := range recent {
		t.Rows = append(t.Rows, []console.Cell{
			{Text: d.ID, ID: true}, {Text: string(d.Kind)}, {Text: d.Service}, {Text: d.Reference().String(), Mono: true},
			{Text: string(d.State)},
			{Text: fmt.Sprintf("%d/%d", d.StepsCompleted, d.StepsTotal)}, {Text: strconv.FormatInt(d.EnvironmentVersion, 10)},
			{Text: d.CreatedAt.UTC().Format(time.DateTime + " UTC")},
			{Text: d.OperationID, Link: console.Prefix + "/operations/" + url.PathEscape(d.OperationID), ID: true},
		})
	}
	return console.View{Title: "Environment " + e.Name, Sections: []console.Section{
		current, lock, {Title: "Recent deploys", Table: t, Empty: "No deploy yet."},
	}}, nil
}

// running is what the environment runs, as its current deploy named it.
func running(e Environment) string {
	switch {
	case e.CurrentArtifact != nil:
		return *e.CurrentArtifact
	case e.CurrentCommitSHA != nil:
		return *e.CurrentCommitSHA
	}
	return "nothing yet"
}

func leaseText(t *time.Time) string {
	if t == nil {
		return "none: waiting in the queue"
	}
	left := time.Until(*t).Round(time.Second)
	if left <= 0 {
		return t.UTC().Format(time.DateTime+" UTC") + " (expired)"
	}
	return t.UTC().Format(time.DateTime+" UTC") + " (" + left.String() + " left)"
}

func environmentLink(name string) string {
	return console.Prefix + "/environments/" + url.PathEscape(name)
}

func deployCell(id string) console.Cell { return console.Cell{Text: id, ID: true} }

func optionalDeployCell(id *string) console.Cell {
	if id == nil {
		return console.Cell{Text: "—"}
	}
	return deployCell(*id)
}

func deployField(label string, id *string) console.Field {
	if id == nil {
		return console.Field{Label: label, Value: "—"}
	}
	return console.Field{Label: label, Value: *id}
}
