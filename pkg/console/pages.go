package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/pkg/approval"
	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// pendingItem is an approval as the inbox shows it.
type pendingItem struct {
	approval.Approval
	Headline string
	Details  []Field
	Body     string
	// Own is true when the signed-in key asked for it: it cannot decide its own request.
	Own bool
	// Alike counts the pending approvals, this one included, that read the same before their bodies.
	Alike int
}

func (c *console) item(s Session, a approval.Approval) pendingItem {
	it := pendingItem{Approval: a, Headline: headline(a.Summary), Details: details(a.Summary),
		Own: a.RequestedBy == string(s.Role)+":"+s.KeyID, Alike: 1}
	if a.Body != nil {
		it.Body = *a.Body
	}
	return it
}

func (c *console) items(s Session, as []approval.Approval) []pendingItem {
	out := make([]pendingItem, 0, len(as))
	for _, a := range as {
		out = append(out, c.item(s, a))
	}
	return out
}

func (c *console) pendingItems(s Session, ps []approval.Pending) []pendingItem {
	out := make([]pendingItem, 0, len(ps))
	for _, p := range ps {
		it := c.item(s, p.Approval)
		it.Alike = p.Alike
		out = append(out, it)
	}
	return out
}

// pendingGroup is an approval.Group as the inbox shows it: one place, however many requests its key sent.
type pendingGroup struct {
	approval.Group
	Items []pendingItem
	// All, when the inbox lists only some of the group, links to the page of all of them.
	All string
}

// groupShown is how many requests of a group the inbox lists; the group's own page lists all of them.
const groupShown = 5

func (c *console) groups(s Session, gs []approval.Group) []pendingGroup {
	out := make([]pendingGroup, 0, len(gs))
	for _, g := range gs {
		pg := pendingGroup{Group: g, Items: c.pendingItems(s, g.Approvals)}
		if g.Count > len(g.Approvals) {
			pg.All = Prefix + "/approvals?group=" + g.ID
		}
		out = append(out, pg)
	}
	return out
}

// headline is the one line a person reads first: what will run, where, for how much.
func headline(s approval.Summary) string {
	str := func(k string) string {
		if v, ok := s[k]; ok && v != nil {
			return fmt.Sprint(v)
		}
		return ""
	}
	ref := str("artifact")
	if ref == "" {
		ref = str("commit_sha")
	}
	switch action := str("action"); action {
	case "deploy":
		return fmt.Sprintf("Deploy %s %s to %s", str("service"), ref, str("environment"))
	case "rollback":
		return fmt.Sprintf("Roll back %s in %s to %s", str("service"), str("environment"), ref)
	case "capture", "refund":
		return fmt.Sprintf("%s %s %s of intent %s (order %s)", strings.ToUpper(action[:1])+action[1:],
			str("amount"), str("currency"), str("intent_id"), str("order_id"))
	default:
		return action
	}
}

// details lists every field of the summary, the rollback possibility and the operation the write replaces
// said in words.
func details(s approval.Summary) []Field {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]Field, 0, len(keys)+1)
	if v, ok := s["can_roll_back"]; ok {
		answer := "no: nothing runs in this environment before it"
		if v == true {
			answer = fmt.Sprintf("yes, to deploy %v", s["replaces_deploy_id"])
		}
		out = append(out, Field{Label: "Can be rolled back", Value: answer})
	}
	if prior, ok := s["supersedes"].(map[string]any); ok {
		label := "Replaces operation"
		if prior["state"] == "unknown" {
			label = "Replaces an operation that may or may not have happened"
		}
		out = append(out, Field{Label: label, Value: fmt.Sprintf("%v (%v), %v; its last dispatch: %v; reason: %v",
			prior["operation_id"], prior["kind"], prior["state"], prior["dispatch_state"], prior["reason"])})
		out = append(out, recoveryFields(prior)...)
	}
	for _, k := range keys {
		if k == "can_roll_back" || k == "supersedes" {
			continue // said in words above
		}
		v := s[k]
		text := "—"
		switch v := v.(type) {
		case nil:
		case string:
			text = v
		default:
			b, _ := json.Marshal(v)
			text = string(b)
		}
		out = append(out, Field{Label: k, Value: text})
	}
	return out
}

// approvalCursor encodes an approval's place for a next-page link; groupCursor a group's, by its newest
// request and its id. parseApprovalCursor reads either.
func approvalCursor(a approval.Approval) string { return cursor(a.CreatedAt, a.ID) }

func groupCursor(g approval.Group) string { return cursor(g.Newest, g.ID) }

func cursor(at time.Time, id string) string {
	return at.UTC().Format(time.RFC3339Nano) + "_" + id
}

func parseApprovalCursor(s string) (*approval.Cursor, error) {
	at, id, ok := strings.Cut(s, "_")
	t, err := time.Parse(time.RFC3339Nano, at)
	if !ok || err != nil || id == "" {
		return nil, problem.Validation(problem.FieldError{Field: "before", Message: "is not a cursor of this list"})
	}
	return &approval.Cursor{CreatedAt: t, ID: id}, nil
}

var groupPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// approvals is the inbox: the pending requests in groups of one key and route (approval.Inbox), then the
// approved ones not used yet. With ?group= it is the page of one group, every request of it.
func (c *console) approvals(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	s := sessionOf(r)
	var before *approval.Cursor
	if v := r.URL.Query().Get("before"); v != "" {
		var err error
		if before, err = parseApprovalCursor(v); err != nil {
			c.fail(w, r, err)
			return
		}
	}
	if group := r.URL.Query().Get("group"); group != "" {
		c.inboxGroup(w, r, s, group, before)
		return
	}
	groups, err := approval.Inbox(ctx, c.o.DB, s.AccountID, approval.InboxFilter{
		Before: before, Groups: c.o.PageSize + 1, PerGroup: groupShown,
	})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	next := ""
	if len(groups) > c.o.PageSize {
		groups = groups[:c.o.PageSize]
		next = Prefix + "/approvals?before=" + url.QueryEscape(groupCursor(groups[len(groups)-1]))
	}
	// Approved but not yet used: the ones a revoke can still stop (the newest page of them).
	unused, err := approval.List(ctx, c.o.DB, s.AccountID, approval.ListFilter{
		State: approval.StateApproved, Unexpired: true, Unused: true, Limit: c.o.PageSize,
	})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "approvals", map[string]any{
		"Title": "Approvals", "Groups": c.groups(s, groups), "Approved": c.items(s, unused), "Next": next,
		"Done": doneNotice(r.URL.Query().Get("done")),
	})
}

// inboxGroup is the page of one group of the inbox: every pending request of it, a page at a time.
func (c *console) inboxGroup(w http.ResponseWriter, r *http.Request, s Session, group string, before *approval.Cursor) {
	ctx := r.Context()
	if !groupPattern.MatchString(group) {
		c.fail(w, r, problem.Validation(problem.FieldError{Field: "group", Message: "is not a group of this inbox"}))
		return
	}
	pending, err := approval.InboxGroup(ctx, c.o.DB, s.AccountID, group, before, c.o.PageSize+1)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	next := ""
	if len(pending) > c.o.PageSize {
		pending = pending[:c.o.PageSize]
		next = Prefix + "/approvals?group=" + group + "&before=" + url.QueryEscape(approvalCursor(pending[len(pending)-1].Approval))
	}
	var groups []pendingGroup
	if len(pending) > 0 {
		first := pending[0]
		groups = []pendingGroup{{
			Group: approval.Group{ID: group, RequestedBy: first.RequestedBy, Method: first.Method, Route: first.Route, Count: len(pending)},
			Items: c.pendingItems(s, pending),
		}}
	}
	c.render(w, r, http.StatusOK, "approvals", map[string]any{
		"Title": "Approvals asked by one key", "Groups": groups, "Next": next, "OneGroup": true,
	})
}

// doneNotice is the notice after a decision, or "" for anything a decision's redirect would not send: a link
// from elsewhere cannot make the inbox say what it likes.
func doneNotice(q string) string {
	state, id, _ := strings.Cut(q, " ")
	if !approvalID.MatchString(id) {
		return ""
	}
	for _, s := range decisions {
		if string(s) == state {
			return q
		}
	}
	return ""
}

var approvalID = regexp.MustCompile(`^apv_[A-Za-z0-9_-]{1,64}$`)

var decisions = map[string]approval.State{
	"approve": approval.StateApproved, "deny": approval.StateDenied, "revoke": approval.StateRevoked,
}

// decide goes through pkg/approval like the API: an agent key, the requester's own key or another account's
// approval are refused there, whatever the page showed.
func (c *console) decide(w http.ResponseWriter, r *http.Request) {
	to, ok := decisions[r.PathValue("decision")]
	if !ok {
		c.fail(w, r, problem.New("not_found", "no such decision"))
		return
	}
	a, err := approval.Decide(r.Context(), c.o.DB, auth.From(r.Context()), r.PathValue("id"), to)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	redirect(w, r, Prefix+"/approvals?done="+url.QueryEscape(string(a.State)+" "+a.ID))
}

var states = []opstatus.State{
	opstatus.StateUnknown, opstatus.StateQueued, opstatus.StateRunning, opstatus.StateSucceeded,
	opstatus.StateFailed, opstatus.StateCancelled,
}

func (c *console) operations(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	s := sessionOf(r)
	state, kind, q := r.URL.Query().Get("state"), strings.TrimSpace(r.URL.Query().Get("kind")), strings.TrimSpace(r.URL.Query().Get("q"))
	if state != "" && !validState(state) {
		c.fail(w, r, problem.Validation(problem.FieldError{Field: "state", Message: "is not an operation state"}))
		return
	}
	data := map[string]any{"Title": "Operations", "States": states, "State": state, "Kind": kind, "Q": q}
	if q != "" {
		// A search: the operation with that id, and the operations started under that idempotency key.
		var found []opstatus.Operation
		op, err := opstatus.Get(ctx, c.o.DB, s.AccountID, q)
		switch {
		case err == nil:
			found = append(found, op)
		case !errors.Is(err, problem.ErrNotFound):
			c.fail(w, r, err)
			return
		}
		byKey, err := opstatus.FindByKey(ctx, c.o.DB, s.AccountID, q)
		if err != nil {
			c.fail(w, r, err)
			return
		}
		data["Operations"] = append(found, byKey...)
		c.render(w, r, http.StatusOK, "operations", data)
		return
	}
	page, err := opstatus.List(ctx, c.o.DB, s.AccountID, opstatus.ListFilter{
		State: opstatus.State(state), Kind: kind, After: r.URL.Query().Get("after"), Limit: c.o.PageSize,
	})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	data["Operations"] = page.Operations
	if page.Next != "" {
		v := url.Values{"after": {page.Next}}
		if state != "" {
			v.Set("state", state)
		}
		if kind != "" {
			v.Set("kind", kind)
		}
		data["Next"] = Prefix + "/operations?" + v.Encode()
	}
	c.render(w, r, http.StatusOK, "operations", data)
}

func validState(s string) bool {
	for _, st := range states {
		if string(st) == s {
			return true
		}
	}
	return false
}

// operation is one operation's page: the audit timeline (opstatus.GetTimeline, the same the API and
// `retrysafe audit timeline` show) with the check of its audit records.
func (c *console) operation(w http.ResponseWriter, r *http.Request) {
	tl, err := opstatus.GetTimeline(r.Context(), c.o.DB, sessionOf(r).AccountID, r.PathValue("id"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "operation", map[string]any{"Title": "Operation " + tl.OperationID, "T": tl,
		// Each rendering of the form carries its own key: the same form sent twice is one decision.
		"CanResolve": c.o.Resolve != nil, "ResolveKey": randomToken(), "Done": r.URL.Query().Get("done") == "decided"})
}

// resolve records the decision of the operation page's form; Options.Resolve checks the role, the input
// rules and the operation's state, as the API does.
func (c *console) resolve(w http.ResponseWriter, r *http.Request) {
	if c.o.Resolve == nil {
		c.fail(w, r, problem.NotFound("page"))
		return
	}
	id := r.PathValue("id")
	// Browsers send a textarea's line breaks as CRLF (HTML's form encoding); the decision keeps LF, which is
	// what the API takes and what the text check allows.
	evidence := strings.ReplaceAll(r.PostFormValue("evidence"), "\r\n", "\n")
	d := opstatus.Decision{State: opstatus.State(r.PostFormValue("state")), Evidence: evidence,
		RemoteRef: r.PostFormValue("remote_ref")}
	if err := c.o.Resolve(r, id, r.PostFormValue("idempotency_key"), d); err != nil {
		c.fail(w, r, err)
		return
	}
	redirect(w, r, Prefix+"/operations/"+url.PathEscape(id)+"?done=decided")
}

// redirect sends the browser to to with 303 See Other, after a form or to a page.
func redirect(w http.ResponseWriter, r *http.Request, to string) {
	http.Redirect(w, r, to, http.StatusSeeOther)
}
