package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/agent"
)

// runTestWorker is the test binary as a worker process (RETRYSAFE_TEST_WORKER=1): it carries out the parent's
// operation WORKER_PARENT for action WORKER_ACTION in WORKER_JOURNAL, and kills itself with SIGKILL at the
// crash point WORKER_DIE.
func runTestWorker() int {
	a, err := agent.Open(os.Getenv("WORKER_JOURNAL"), agent.Config{TicketsURL: os.Getenv("WORKER_URL"), APIKey: servicetest.AgentSecret,
		BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond, Hook: func(p string) {
			if p == os.Getenv("WORKER_DIE") {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	res, err := a.Do(context.Background(), os.Getenv("WORKER_ACTION"), "create_ticket", ticketArgs(os.Getenv("WORKER_TITLE")),
		agent.DoOptions{ParentOperation: os.Getenv("WORKER_PARENT")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
	return 0
}

// killedWorker runs a real worker process that dies by SIGKILL at point and returns its pid.
func (b *bundle) killedWorker(t *testing.T, journal, parentOp, action, title, point string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "RETRYSAFE_TEST_WORKER=1", "WORKER_JOURNAL="+journal, "WORKER_URL="+b.env.URL,
		"WORKER_PARENT="+parentOp, "WORKER_ACTION="+action, "WORKER_TITLE="+title, "WORKER_DIE="+point)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("worker: %v, output %s; want it killed by SIGKILL at %s", err, out, point)
	}
	return cmd.Process.Pid
}

// delegate hands action to a worker journaling in a new file: the parent journals the operation, sends nothing.
func delegate(t *testing.T, b *bundle, parent *agent.Agent, action, title string) (agent.Result, string) {
	t.Helper()
	worker := filepath.Join(t.TempDir(), "worker.journal")
	res, err := parent.Do(t.Context(), action, "create_ticket", ticketArgs(title), agent.DoOptions{DelegateTo: worker})
	if err != nil || res.State != agent.StateOpen || res.Attempts != 0 {
		t.Fatalf("delegate: %+v, %v; want open with no attempt", res, err)
	}
	if n := b.tickets(t, title); n != 0 || b.fault.writes.Load() != 0 {
		t.Fatalf("delegating sent %d writes, %d tickets; want none", b.fault.writes.Load(), n)
	}
	return res, worker
}

// A worker process is killed after the service created the ticket and before it journaled the answer. Its
// journal names the parent's operation and its own process for the attempt; the parent's resume finds the
// worker, reads that the attempt has no end and that no worker holds the journal, and reconciles from the
// service's record under the one key: succeeded, one ticket, and not one write sent by the parent.
func TestDelegatedWorkerThatDiedIsReconciledByTheParent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	parent := b.open(t)
	res, worker := delegate(t, b, parent, "alert-9-ticket", "delegated and lost")
	pid := b.killedWorker(t, worker, res.OperationID, "alert-9-ticket", "delegated and lost", "after_answer")
	if n := b.tickets(t, "delegated and lost"); n != 1 {
		t.Fatalf("%d tickets after the worker; want 1", n)
	}
	wj, err := agent.ReadJournal(worker)
	if err != nil {
		t.Fatal(err)
	}
	wop, _ := wj.Operation("alert-9-ticket")
	if wop.ParentOperationID != res.OperationID || wop.IdempotencyKey != res.IdempotencyKey || len(wop.Attempts) != 1 ||
		wop.Attempts[0].Process == nil || wop.Attempts[0].Process.PID != pid || wop.Attempts[0].Finished != nil {
		t.Fatalf("worker operation %+v, attempts %v; want the parent's id and key, one attempt of pid %d without an end", wop, wop.Attempts, pid)
	}

	results, err := parent.Resume(t.Context())
	if err != nil || len(results) != 1 || results[0].State != agent.StateSucceeded {
		t.Fatalf("parent resume: %+v, %v; want succeeded", results, err)
	}
	op, _ := parent.Operation("alert-9-ticket")
	if n := b.tickets(t, "delegated and lost"); n != 1 || len(op.Attempts) != 0 || b.fault.writes.Load() != 0 {
		t.Fatalf("%d tickets, %d parent attempts, %d writes from the parent; want 1, 0, 0", n, len(op.Attempts), b.fault.writes.Load())
	}
	kinds := map[string]int{}
	for _, o := range op.Observations {
		kinds[o.Kind]++
	}
	if kinds[agent.ObsWorkerState] != 1 || kinds[agent.ObsLookup] != 1 {
		t.Errorf("parent observations %v; want the worker's state read, then one lookup", kinds)
	}
}

// A worker killed after journaling its attempt and before sending it leaves nothing at the service. The parent
// finds the operation unresolved and never sends it itself, however often it resumes; the worker, resumed,
// does not send again on its own either (the parent owns retries) while the parent reads it as running; a
// person's retry on the worker sends it, once, and the parent then settles from the worker.
func TestMissingWorkerResultNeverSendsFromTheParent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	parent := b.open(t)
	const action, title = "alert-10-ticket", "delegated never sent"
	res, worker := delegate(t, b, parent, action, title)
	b.killedWorker(t, worker, res.OperationID, action, title, "before_send")

	for range 2 {
		results, err := parent.Resume(t.Context())
		if err != nil || len(results) != 1 || results[0].State != agent.StateUnresolved || results[0].Code != agent.CodeOperationUnresolved {
			t.Fatalf("parent resume: %+v, %v; want unresolved", results, err)
		}
	}
	if n := b.tickets(t, title); n != 0 || b.fault.writes.Load() != 0 {
		t.Fatalf("%d tickets, %d writes from the parent; want none", n, b.fault.writes.Load())
	}

	w, err := agent.Open(worker, agent.Config{TicketsURL: b.env.URL, APIKey: servicetest.AgentSecret,
		BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	wres, err := w.Resume(t.Context())
	if err != nil || len(wres) != 1 || wres[0].State != agent.StateNeedsHuman || wres[0].Code != agent.CodeParentOwnsRetries || wres[0].Attempts != 1 {
		t.Fatalf("worker resume: %+v, %v; want needs_human %s after its one attempt", wres, err, agent.CodeParentOwnsRetries)
	}
	if results, err := parent.Resume(t.Context()); err != nil || results[0].State != agent.StateInProgress {
		t.Fatalf("parent resume while the worker holds its journal: %+v, %v; want in_progress", results, err)
	}
	if n := b.tickets(t, title); n != 0 {
		t.Fatalf("%d tickets before anyone decided; want 0", n)
	}
	if r, err := w.Retry(t.Context(), action, agent.RetryRequest{By: "alice", Reason: "the ticket is not there"}); err != nil || r.State != agent.StateSucceeded {
		t.Fatalf("retry on the worker: %+v, %v", r, err)
	}
	w.Close()
	results, err := parent.Resume(t.Context())
	if err != nil || results[0].State != agent.StateSucceeded || results[0].HTTPStatus != http.StatusCreated ||
		!strings.Contains(string(results[0].Body), `"title":"delegated never sent"`) {
		t.Fatalf("parent resume: %+v, %v; want succeeded from the worker, with its answer", results, err)
	}
	if n := b.tickets(t, title); n != 1 || b.fault.writes.Load() != 0 {
		t.Fatalf("%d tickets, %d writes from the parent; want 1 and 0", n, b.fault.writes.Load())
	}
}

// Gathering facts is an intent of its own: a read tool takes no parent operation and is never delegated; it
// gets an operation of its own.
func TestFactGatheringGetsItsOwnOperation(t *testing.T) {
	t.Parallel()
	c, err := agent.ParseTools([]byte(`hosts: {here: {local: true}}
tools:
  - {name: disk_free, kind: command, summary: Disk., host: here, family: read, command: "echo {{path}}",
     input_schema: {type: object, required: [path], properties: {path: {type: string}}}}
`))
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.Open(filepath.Join(t.TempDir(), "j"), agent.Config{Tools: c})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	args := json.RawMessage(`{"path":"/"}`)
	for _, opts := range []agent.DoOptions{{ParentOperation: "aop_parent"}, {DelegateTo: filepath.Join(t.TempDir(), "w")}} {
		if _, err := a.Do(t.Context(), "df", "disk_free", args, opts); !errors.Is(err, agent.ErrBadArguments) {
			t.Errorf("%+v: %v; want ErrBadArguments", opts, err)
		}
	}
	if _, ok := a.Operation("df"); ok {
		t.Fatal("a refused read was journaled")
	}
	res, err := a.Do(t.Context(), "df", "disk_free", args, agent.DoOptions{ParentRun: "run_planner"})
	if op, _ := a.Operation("df"); err != nil || res.State != agent.StateSucceeded || op.ParentOperationID != "" {
		t.Fatalf("%+v, %v; want its own operation, succeeded", res, err)
	}
}
