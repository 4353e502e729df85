package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Journal is a read-only view of a journal file, for people and tools that must not take the lock (show,
// get_operation from another process).
type Journal struct {
	v *view
}

// ReadJournal reads the journal at path without locking it.
func ReadJournal(path string) (*Journal, error) {
	recs, err := ReadRecords(path)
	if err != nil {
		return nil, err
	}
	v := newView()
	for _, r := range recs {
		if err := v.apply(r); err != nil {
			return nil, err
		}
	}
	return &Journal{v: v}, nil
}

// Operations are the journal's operations in creation order.
func (j *Journal) Operations() []*Operation { return j.v.order }

// Operation finds an operation by action id or operation id.
func (j *Journal) Operation(id string) (*Operation, bool) {
	if op := j.v.byAction[id]; op != nil {
		return op, true
	}
	op, ok := j.v.ops[id]
	return op, ok
}

// Result is how op stands, as Do would return it.
func (j *Journal) Result(op *Operation) Result { return resultOf(op) }

// State is the operation's state word.
func (o *Operation) State() string {
	if o.Settled == nil {
		return StateOpen
	}
	return o.Settled.State
}

// Printable returns s with every character a terminal could act on written as a Go escape (\x1b, \u202e):
// C0 and C1 controls (ESC, BEL, OSC and CSI introducers, line breaks), DEL, bidirectional and other format
// characters, separators other than the space, and bytes that are not UTF-8. What a model, a service or a
// journal supplies is shown through it, so it can neither move the cursor, retitle or recolour the terminal,
// write to the clipboard, reorder what is shown, nor forge a line of its own.
func Printable(s string) string {
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || !strconv.IsPrint(r) {
			break
		}
		i += size
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case strconv.IsPrint(r):
			b.WriteString(s[i : i+size])
		default:
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}

// printSafe is fmt.Fprintf with every string argument made Printable: show's layout comes from its format
// strings alone, and nothing from the journal reaches the terminal raw.
func printSafe(w io.Writer, format string, args ...any) {
	for i, arg := range args {
		switch v := arg.(type) {
		case []byte:
			args[i] = Printable(string(v))
		case json.RawMessage:
			args[i] = Printable(string(v))
		default:
			if rv := reflect.ValueOf(arg); rv.Kind() == reflect.String {
				args[i] = Printable(rv.String())
			}
		}
	}
	fmt.Fprintf(w, format, args...)
}

// WriteSummary prints one line per operation.
func (j *Journal) WriteSummary(w io.Writer) {
	printSafe(w, "%-44s %-24s %-22s %-12s %s\n", "OPERATION", "ACTION", "TOOL", "STATE", "ATTEMPTS")
	for _, op := range j.v.order {
		printSafe(w, "%-44s %-24s %-22s %-12s %d\n", op.OperationID, op.ActionID, op.Tool, op.State(), len(op.Attempts))
	}
}

// WriteTimeline prints one operation's story, agent side: the intent, every attempt with its lineage and
// dispatch state, every observation (negative ones too), and how it ended.
func (op *Operation) WriteTimeline(w io.Writer) {
	op.writeIntent(w)
	op.writeProvenance(w)
	for _, l := range op.timelineEntries() {
		printSafe(w, "  %-27s %s\n", strings.TrimSuffix(l.at, "~"), l.text)
	}
	if s := op.Settled; s != nil {
		printSafe(w, "  next step: %s\n", s.NextStep)
	} else {
		printSafe(w, "  not settled: resume drives it to an end\n")
	}
}

// writeIntent prints what the operation is: the tool call, its arguments and fingerprint, and the idempotency
// key that makes sending it again safe.
func (op *Operation) writeIntent(w io.Writer) {
	printSafe(w, "operation %s  action %s  state %s\n", op.OperationID, strconv.Quote(op.ActionID), op.State())
	if op.Command == nil {
		printSafe(w, "  intent      %s %s %s (%s), retry mode %s, budget %d\n", op.Tool, op.Method, op.RouteTemplate, op.Path, op.RetryMode, op.Budget)
	}
	op.Command.writeIntent(w, op)
	printSafe(w, "  arguments   %s\n", op.Args)
	printSafe(w, "  fingerprint sha256:%s\n", op.Fingerprint)
	switch {
	case op.IdempotencyKey != "" && op.KeyNamespace != "":
		secret := ""
		if op.KeySecretRef != "" {
			secret = " under the namespace's secret (" + op.KeySecretRef + ")"
		}
		printSafe(w, "  key         %s (derived from namespace %s and the action id%s; journaled %s, before the first send)\n",
			op.IdempotencyKey, strconv.Quote(op.KeyNamespace), secret, op.At)
	case op.IdempotencyKey != "":
		printSafe(w, "  key         %s (made and journaled %s, before the first send)\n", op.IdempotencyKey, op.At)
	default:
		printSafe(w, "  key         none: a declared state, safe to send again\n")
	}
}

// writeProvenance prints who acted and what the operation is tied to: its authority, the delegating run, the
// key it was made with, the operations it supersedes or remediates, and the service's operation id.
func (op *Operation) writeProvenance(w io.Writer) {
	printSafe(w, "  authority   %s\n", op.AuthorityRef)
	if op.ParentRunID != "" {
		printSafe(w, "  parent run  %s (the run that delegated this action)\n", op.ParentRunID)
	}
	if op.ParentOperationID != "" {
		printSafe(w, "  parent op   %s (the parent's operation: it owns the retries)\n", op.ParentOperationID)
	}
	if op.Delegation != nil {
		printSafe(w, "  worker      %s (handed to a worker journaling there; nothing is sent from this journal)\n", op.Delegation.WorkerJournal)
	}
	if op.Principal != nil {
		printSafe(w, "  key id      %s (the agent's name for the API key it was made with)\n", op.Principal.KeyID)
	} else {
		printSafe(w, "  key id      not recorded (journaled before agents recorded their key)\n")
	}
	if op.SupersedesOperationID != "" {
		printSafe(w, "  supersedes  %s (server %s)\n", op.SupersedesOperationID, op.SupersedesServerOpID)
	}
	if op.RemediatesServerOpID != "" {
		printSafe(w, "  remediates  %s (server)\n", op.RemediatesServerOpID)
	}
	if id := op.ServerOperationID(); id != "" {
		printSafe(w, "  server op   %s\n", id)
	}
}

// timelineEntry is one line of the timeline: when it happened and what. An at ending in "~" sorts after the
// same at without it, and is printed without the "~".
type timelineEntry struct{ at, text string }

// timelineEntries are the operation's attempts, their ends, its observations and its settlement, in the order
// they happened (journal order among equal times).
func (op *Operation) timelineEntries() []timelineEntry {
	var lines []timelineEntry
	for _, at := range op.Attempts {
		lines = append(lines, timelineEntry{at.At, attemptText(at)})
		if r := at.Finished; r != nil {
			lines = append(lines, timelineEntry{r.At, attemptResultText(r)})
		} else {
			lines = append(lines, timelineEntry{at.At + "~", "  -> no recorded end: the agent stopped during this attempt"})
		}
	}
	for _, o := range op.Observations {
		lines = append(lines, timelineEntry{o.At, observationText(o)})
	}
	if s := op.Settled; s != nil {
		lines = append(lines, timelineEntry{s.At, fmt.Sprintf("settled %s: %s", s.State, s.Reason)})
	}
	sort.SliceStable(lines, func(i, k int) bool { return lines[i].at < lines[k].at })
	return lines
}

// attemptText describes a send: its number, the decision behind it, the lineage it claimed (and what was
// really sent, where the service's view forced a nearer one), and the budget and run it spent.
func attemptText(at *Attempt) string {
	t := fmt.Sprintf("attempt %d %s  %s", at.Number, at.AttemptID, at.Decision)
	if at.RetryOf != "" {
		t += fmt.Sprintf("  retry of %s (%s)", at.RetryOf, at.RetryReason)
		if at.RetryOfSent != at.RetryOf {
			t += fmt.Sprintf(" [Retry-Of sent: %q, the nearest attempt the service had seen]", at.RetryOfSent)
		}
		if at.RetryReasonSent != "" && at.RetryReasonSent != at.RetryReason {
			t += fmt.Sprintf(" [Retry-Reason sent: %s, the nearest the service lists]", at.RetryReasonSent)
		}
	}
	t += fmt.Sprintf("  budget left %d  run %s", at.BudgetLeft, at.RunID)
	t += at.Command.text()
	if p := at.Process; p != nil {
		t += fmt.Sprintf("  process %s pid %d", p.Host, p.PID)
	}
	if at.ApprovalID != "" {
		t += "  approval " + at.ApprovalID
	}
	if at.GrantID != "" {
		t += "  grant " + at.GrantID
	}
	return t
}

// attemptResultText describes how a send ended: its dispatch state, the service's answer and operation, and
// how long it took.
func attemptResultText(r *AttemptResult) string {
	t := fmt.Sprintf("  -> %s", r.DispatchState)
	if r.Status != 0 {
		t += fmt.Sprintf(" %d", r.Status)
	}
	for _, s := range []string{r.Code, r.Error} {
		if s != "" {
			t += " " + s
		}
	}
	if r.Replayed {
		t += " (replayed by the service)"
	}
	t += labelled(" op ", r.ServerOperationID) + labelled(" state ", r.ServerState) + labelled(" key expires ", r.KeyExpiresAt)
	return t + r.Command.text() + fmt.Sprintf(" in %dms", r.DurationMS)
}

// observationText describes one look at the service: where it looked, what it found (or that it found
// nothing), and for an operator's decision who decided what.
func observationText(o *Observation) string {
	t := "observation " + o.Kind + labelled("  ", o.Endpoint)
	if o.Status != 0 {
		t += fmt.Sprintf("  %d", o.Status)
	}
	switch {
	case o.Found != nil && *o.Found:
		t += fmt.Sprintf("  found %s state %s", o.ServerOperationID, o.ServerState)
		if len(o.KnownAttempts) > 0 {
			t += "  attempts it saw: " + strings.Join(o.KnownAttempts, ", ")
		}
		t += labelled("  key expires ", o.KeyExpiresAt)
	case o.Found != nil:
		t += "  NOT FOUND"
	}
	if o.Kind == ObsOperatorDecision {
		t += fmt.Sprintf("  by %s: %s", o.DecidedBy, o.ServerState) + labelled("  remote ref ", o.RemoteRef)
	}
	t += o.Command.text()
	if o.Detail != "" {
		t += "  (" + o.Detail + ")"
	}
	return t
}

// labelled is label followed by value, or nothing when value is empty.
func labelled(label, value string) string {
	if value == "" {
		return ""
	}
	return label + value
}
