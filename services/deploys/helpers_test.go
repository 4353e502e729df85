package deploys_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/services/deploys"
)

// artifact and commit return distinct immutable references.
func artifact(n int) string { return fmt.Sprintf("registry.example.com/shop/api@sha256:%064x", n) }
func commit(n int) string   { return fmt.Sprintf("%040x", n) }

type bundle struct {
	env      *servicetest.Env
	db       *gorm.DB
	agent    *apitest.Client
	approver *apitest.Client
	store    deploys.PostgresStore
	target   deploys.SimulatedTarget
	// faults are armed on target (TargetFaults.Arm).
	faults *deploys.TargetFaults
	ctrl   *deploys.Controller
	recon  *deploys.Reconciler
}

type options struct {
	// background starts the controller; otherwise tests drive it with b.runOnce. recovery, when set, starts
	// the controller and the process-wide workers (recovery, approval expiry) with that interval.
	background bool
	recovery   time.Duration
	// throughProxy runs the service, its controller and target on a pool through env.Proxy (b.db stays direct).
	throughProxy bool
	// stepDuration replaces the 20 ms steps.
	stepDuration time.Duration
	// maxRunning replaces the cap of 1 running deploy per account; queueTimeout the 10 minute queue timeout.
	maxRunning   int
	queueTimeout time.Duration
}

// setup serves the deploys service on a lent schema, as cmd/retrysafe wires it, with short steps and leases.
func setup(t *testing.T, o options) *bundle {
	t.Helper()
	var opts []servicetest.Option
	if o.throughProxy {
		opts = append(opts, servicetest.ThroughProxy(database.Options{
			MaxConns: 6, ConnectTimeout: 500 * time.Millisecond, AcquireTimeout: time.Second, StatementTimeout: 2 * time.Second,
		}))
	}
	env := servicetest.New(t, opts...)
	faults := &deploys.TargetFaults{}
	b := &bundle{env: env, db: env.DB.DB, target: deploys.SimulatedTarget{DB: env.ServiceDB, Faults: faults}, faults: faults}
	step := 20 * time.Millisecond
	if o.stepDuration > 0 {
		step = o.stepDuration
	}
	maxRunning, queueTimeout := 1, 10*time.Minute
	if o.maxRunning > 0 {
		maxRunning = o.maxRunning
	}
	if o.queueTimeout > 0 {
		queueTimeout = o.queueTimeout
	}
	svc, err := deploys.New(env.Deps, deploys.Config{
		Store: b.store, Target: b.target, ApprovalEnvironments: []string{"production"}, ApprovalTTL: time.Hour,
		Steps: 2, StepDuration: step, LockLease: 5 * time.Second, Heartbeat: 10 * time.Millisecond,
		PollInterval: 10 * time.Millisecond, Workers: 2, MaxRunningPerAccount: maxRunning, QueueTimeout: queueTimeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	b.ctrl, b.recon = svc.Controller, svc.Reconciler
	if o.background || o.recovery > 0 {
		env.RunWorkers(t, service.Background{RecoveryInterval: o.recovery}, svc)
	}
	b.agent = env.Serve(t, svc)
	b.approver = b.agent.As(servicetest.ApproverSecret)
	return b
}

// runOnce runs the controller over one queued deploy, to its end.
func (b *bundle) runOnce(t *testing.T) {
	t.Helper()
	ran, err := b.ctrl.RunOnce(context.Background())
	if err != nil || !ran {
		t.Fatalf("controller: ran=%v err=%v", ran, err)
	}
}

func deployBody(service, environment, ref string, extra ...string) string {
	field := "artifact"
	if len(ref) == 40 || len(ref) == 64 {
		field = "commit_sha"
	}
	body := fmt.Sprintf(`{"service":%q,"environment":%q,%q:%q`, service, environment, field, ref)
	for _, e := range extra {
		body += "," + e
	}
	return body + "}"
}

func decodeDeploy(t *testing.T, res *apitest.Response) deploys.Status {
	t.Helper()
	var s deploys.Status
	res.Decode(t, &s)
	return s
}

// waitFinal polls the deploy until it is final; it is a synchronisation point, not a timing assertion.
func waitFinal(t *testing.T, c *apitest.Client, id string) deploys.Status {
	t.Helper()
	var s deploys.Status
	servicetest.Eventually(t, "deploy "+id+" final", func() bool {
		s = decodeDeploy(t, c.Get("/v1/deploys/"+id).Status(t, 200))
		return s.State.Final()
	})
	return s
}

func count(t *testing.T, db *gorm.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Raw(query, args...).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

func environment(t *testing.T, c *apitest.Client, name string) deploys.Environment {
	t.Helper()
	var env deploys.Environment
	c.Get("/v1/environments/"+name).Status(t, 200).Decode(t, &env)
	return env
}

// finalEvents counts the events of an operation that moved it into a final state.
func finalEvents(t *testing.T, db *gorm.DB, opID string) int {
	t.Helper()
	return count(t, db, `SELECT count(*) FROM operation_events WHERE operation_id = ? AND to_state IN ('succeeded', 'failed', 'cancelled')`, opID)
}

func problemFields(t *testing.T, res *apitest.Response) []string {
	t.Helper()
	var doc struct {
		Errors []struct{ Field string } `json:"errors"`
	}
	if err := json.Unmarshal(res.Body, &doc); err != nil {
		t.Fatal(err)
	}
	var fields []string
	for _, e := range doc.Errors {
		fields = append(fields, e.Field)
	}
	return fields
}

// requestApproval asks, as c, for an approval of POST path with key and body, and returns the approval.
func requestApproval(t *testing.T, c *apitest.Client, path, key, body string) map[string]any {
	t.Helper()
	req := fmt.Sprintf(`{"method":"POST","path":%q,"idempotency_key":%q,"body":%s}`, path, key, body)
	return c.Post("/v1/approvals", req, apitest.Key("approval-of-"+key+"-"+fmt.Sprint(time.Now().UnixNano()))).Status(t, 201).JSON(t)
}

// approved requests an approval as the agent and grants it as the approver; it returns its id.
func (b *bundle) approved(t *testing.T, path, key, body string) string {
	t.Helper()
	id := requestApproval(t, b.agent, path, key, body)["id"].(string)
	b.approver.Post("/v1/approvals/"+id+"/approve", nil).Status(t, 200)
	return id
}

func approvalID(id string) apitest.Option { return apitest.Header("Approval-Id", id) }
