package deploys_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/approval"
	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/deploys"
)

func TestProductionDeploysNeedAnApprovalOfTheExactRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	prod := func(n int) string { return deployBody("api", "production", artifact(n)) }
	refused := func(name string, res *apitest.Response, status int, code string) {
		t.Helper()
		res.Status(t, status)
		if got := res.Str(t, "code"); got != code {
			t.Errorf("%s: code %q, want %q: %s", name, got, code, res.Body)
		}
		if n := count(t, b.db, `SELECT count(*) FROM deploys`); n != 0 {
			t.Fatalf("%s: %d deploys created", name, n)
		}
	}

	refused("no approval", b.agent.Post("/v1/deploys", prod(1), apitest.Key("none")), 428, "approval_required")

	pending := requestApproval(t, b.agent, "/v1/deploys", "pending", prod(1))
	summary := pending["summary"].(map[string]any)
	if pending["state"] != "pending" || summary["environment"] != "production" || summary["service"] != "api" || summary["artifact"] != artifact(1) {
		t.Fatalf("approval: %v", pending)
	}
	refused("pending", b.agent.Post("/v1/deploys", prod(1), apitest.Key("pending"), approvalID(pending["id"].(string))), 403, "approval_invalid")

	denied := requestApproval(t, b.agent, "/v1/deploys", "denied", prod(1))["id"].(string)
	b.approver.Post("/v1/approvals/"+denied+"/deny", nil).Status(t, 200)
	refused("denied", b.agent.Post("/v1/deploys", prod(1), apitest.Key("denied"), approvalID(denied)), 403, "approval_invalid")

	expired := b.approved(t, "/v1/deploys", "expired", prod(1))
	if err := b.db.Exec(`UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = ?`, expired).Error; err != nil {
		t.Fatal(err)
	}
	refused("expired", b.agent.Post("/v1/deploys", prod(1), apitest.Key("expired"), approvalID(expired)), 403, "approval_invalid")

	other := b.agent.As(servicetest.OtherAgentSecret)
	foreign := requestApproval(t, other, "/v1/deploys", "foreign", prod(1))["id"].(string)
	other.As(servicetest.OtherApproverSecret).Post("/v1/approvals/"+foreign+"/approve", nil).Status(t, 200)
	refused("foreign", b.agent.Post("/v1/deploys", prod(1), apitest.Key("foreign"), approvalID(foreign)), 403, "approval_invalid")

	self := requestApproval(t, b.approver, "/v1/deploys", "self", prod(1))["id"].(string)
	if code := b.approver.Post("/v1/approvals/"+self+"/approve", nil).Status(t, 403).Str(t, "code"); code != "approval_invalid" {
		t.Fatalf("self-approval: %s", code)
	}
	refused("self-granted", b.agent.Post("/v1/deploys", prod(1), apitest.Key("self"), approvalID(self)), 403, "approval_invalid")

	changed := b.approved(t, "/v1/deploys", "changed", prod(1))
	refused("changed body", b.agent.Post("/v1/deploys", prod(2), apitest.Key("changed"), approvalID(changed)), 403, "approval_invalid")

	otherKey := b.approved(t, "/v1/deploys", "key-a", prod(1))
	refused("another key", b.agent.Post("/v1/deploys", prod(1), apitest.Key("key-b"), approvalID(otherKey)), 403, "approval_invalid")

	// A revoked approval is refused like a denied one; the revoke is in the approval's audit chain, and one
	// already used cannot be revoked.
	revoked := b.approved(t, "/v1/deploys", "revoked", prod(1))
	if code := b.agent.Post("/v1/approvals/"+revoked+"/revoke", nil).Status(t, 403).Str(t, "code"); code != "forbidden" {
		t.Fatalf("agent revoke: %s", code)
	}
	if state := b.approver.Post("/v1/approvals/"+revoked+"/revoke", nil).Status(t, 200).Str(t, "state"); state != "revoked" {
		t.Fatalf("revoked approval state %s", state)
	}
	b.approver.Post("/v1/approvals/"+revoked+"/revoke", nil).Status(t, 200) // the same decision again
	refused("revoked", b.agent.Post("/v1/deploys", prod(1), apitest.Key("revoked"), approvalID(revoked)), 403, "approval_invalid")
	if n := count(t, b.db, `SELECT count(*) FROM approval_events WHERE approval_id = ? AND type = 'revoked' AND actor LIKE 'approver:%'`, revoked); n != 1 {
		t.Fatalf("%d revoked records in the approval's chain, want 1", n)
	}

	ok := b.approved(t, "/v1/deploys", "ok", prod(1))
	first := b.agent.Post("/v1/deploys", prod(1), apitest.Key("ok"), approvalID(ok)).Status(t, 202)
	replay := b.agent.Post("/v1/deploys", prod(1), apitest.Key("ok")).Status(t, 202)
	if replay.Header.Get("Idempotent-Replayed") != "true" || string(replay.Body) != string(first.Body) {
		t.Fatalf("replay of the approved request: %s", replay.Body)
	}
	if n := count(t, b.db, `SELECT count(*) FROM deploys`); n != 1 {
		t.Fatalf("%d deploys, want 1", n)
	}
	opID := first.Header.Get("Operation-Id")
	if n := count(t, b.db, `SELECT count(*) FROM approvals WHERE id = ? AND used_by_operation_id = ?`, ok, opID); n != 1 {
		t.Fatal("the approval is not marked used by the deploy's operation")
	}
	if n := count(t, b.db, `SELECT count(*) FROM operation_events WHERE operation_id = ? AND type = 'approval_checked'`, opID); n != 1 {
		t.Fatalf("%d approval_checked events, want 1", n)
	}
	if code := b.approver.Post("/v1/approvals/"+ok+"/revoke", nil).Status(t, 409).Str(t, "code"); code != "invalid_state" {
		t.Fatalf("revoke of a used approval: %s", code)
	}
	// Other environments need none.
	b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(1)), apitest.Key("staging")).Status(t, 202)
}

func TestRollbackIsItsOwnOperation(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	a := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(1)), apitest.Key("a")).Status(t, 202))
	b.runOnce(t)
	bd := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(2)), apitest.Key("b")).Status(t, 202))
	b.runOnce(t)

	res := b.agent.Post("/v1/deploys/"+bd.ID+"/rollback", `{}`, apitest.Key("rb")).Status(t, 202)
	rb := decodeDeploy(t, res)
	if rb.Kind != deploys.DeployRollback || rb.RollsBackDeployID == nil || *rb.RollsBackDeployID != bd.ID ||
		rb.Artifact == nil || *rb.Artifact != artifact(1) || rb.OperationID == bd.OperationID || rb.EnvironmentVersion != 2 {
		t.Fatalf("rollback: %+v", rb.Deploy)
	}
	if op := b.agent.Get("/v1/operations/"+rb.OperationID).Status(t, 200); op.Str(t, "kind") != deploys.KindRollback {
		t.Fatalf("rollback operation: %s", op.Body)
	}
	// The same lock: nothing else deploys while the rollback is queued.
	locked := b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(3)), apitest.Key("c")).Status(t, 409)
	if locked.Str(t, "holder_deploy_id") != rb.ID {
		t.Fatalf("deploy during rollback: %s", locked.Body)
	}
	b.runOnce(t)
	env := environment(t, b.agent, "staging")
	if env.Version != 3 || *env.CurrentDeployID != rb.ID || *env.CurrentArtifact != artifact(1) || *env.PreviousDeployID != bd.ID {
		t.Fatalf("environment after rollback: %+v", env)
	}
	// A retry of the rollback replays it, though bd is no longer current; a new rollback of bd is refused.
	replay := b.agent.Post("/v1/deploys/"+bd.ID+"/rollback", `{}`, apitest.Key("rb")).Status(t, 202)
	if replay.Header.Get("Idempotent-Replayed") != "true" || decodeDeploy(t, replay).ID != rb.ID {
		t.Fatalf("rollback retry: %s", replay.Body)
	}
	if code := b.agent.Post("/v1/deploys/"+bd.ID+"/rollback", `{}`, apitest.Key("rb-2")).Status(t, 409).Str(t, "code"); code != "invalid_state" {
		t.Fatalf("rollback of a deploy that is not current: %s", code)
	}
	if code := b.agent.Post("/v1/deploys/"+a.ID+"/rollback", `{}`, apitest.Key("rb-3")).Status(t, 409).Str(t, "code"); code != "invalid_state" {
		t.Fatalf("rollback of an old deploy: %s", code)
	}
	b.agent.Post("/v1/deploys/nope/rollback", `{}`, apitest.Key("rb-4")).Status(t, 404)
	if n := count(t, b.db, `SELECT count(*) FROM deploy_target_activations`); n != 3 {
		t.Fatalf("%d activations, want 3", n)
	}
}

func TestProductionRollbackNeedsItsOwnApproval(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	prod := func(n int) string { return deployBody("api", "production", artifact(n)) }
	b.agent.Post("/v1/deploys", prod(1), apitest.Key("p1"), approvalID(b.approved(t, "/v1/deploys", "p1", prod(1)))).Status(t, 202)
	b.runOnce(t)
	p2Approval := b.approved(t, "/v1/deploys", "p2", prod(2))
	p2 := decodeDeploy(t, b.agent.Post("/v1/deploys", prod(2), apitest.Key("p2"), approvalID(p2Approval)).Status(t, 202))
	b.runOnce(t)

	path := "/v1/deploys/" + p2.ID + "/rollback"
	b.agent.Post(path, `{}`, apitest.Key("rb")).Status(t, 428)
	b.agent.Post(path, `{}`, apitest.Key("rb"), approvalID(p2Approval)).Status(t, 403)

	req := requestApproval(t, b.agent, path, "rb", `{}`)
	summary := req["summary"].(map[string]any)
	if summary["action"] != "rollback" || summary["rolls_back_deploy_id"] != p2.ID || summary["rollback_target"] != artifact(1) ||
		summary["environment"] != "production" || summary["service"] != "api" {
		t.Fatalf("rollback approval summary: %v", summary)
	}
	if n := count(t, b.db, `SELECT count(*) FROM deploys WHERE kind = 'rollback'`); n != 0 {
		t.Fatalf("%d rollbacks before approval", n)
	}
	b.approver.Post("/v1/approvals/"+req["id"].(string)+"/approve", nil).Status(t, 200)
	rb := decodeDeploy(t, b.agent.Post(path, `{}`, apitest.Key("rb"), approvalID(req["id"].(string))).Status(t, 202))
	if rb.Kind != deploys.DeployRollback || rb.OperationID == p2.OperationID || *rb.Artifact != artifact(1) {
		t.Fatalf("rollback: %+v", rb.Deploy)
	}
	b.runOnce(t)
	if env := environment(t, b.agent, "production"); *env.CurrentArtifact != artifact(1) || env.Version != 3 {
		t.Fatalf("environment after rollback: %+v", env)
	}
}

// TestHostileApprovalRequests: a NUL or a bidirectional override in the path an approval names, and an
// Approval-Id that no approval can have, are refused before they reach SQL, and nothing is stored or deployed.
func TestHostileApprovalRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	prod := deployBody("api", "production", artifact(1))
	for _, path := range []string{"/v1/deploys\u0000", "/v1/deploys/dep_\u0000/rollback", "/v1/\u202edeploys", "/v1/deploys\n"} {
		quoted, _ := json.Marshal(path)
		body := fmt.Sprintf(`{"method":"POST","path":%s,"idempotency_key":"k","body":%s}`, quoted, prod)
		res := b.agent.Post("/v1/approvals", body, apitest.Key("hostile")).Status(t, 422)
		if fields := problemFields(t, res); len(fields) != 1 || fields[0] != "path" {
			t.Errorf("path %q: fields %v: %s", path, fields, res.Body)
		}
	}
	for _, id := range []string{"apv_' OR 1=1 --", "apv_\u202e", "apv_" + strings.Repeat("0", 5000)} {
		res := b.agent.Post("/v1/deploys", prod, apitest.Key("hostile-id"), approvalID(id)).Status(t, 403)
		if code := res.Str(t, "code"); code != "approval_invalid" {
			t.Errorf("Approval-Id %q: %s", id, res.Body)
		}
	}
	if n := count(t, b.db, `SELECT count(*) FROM approvals`) + count(t, b.db, `SELECT count(*) FROM deploys`); n != 0 {
		t.Errorf("%d approvals and deploys stored from hostile requests", n)
	}
}

// TestArtifactLengthIsBounded: an artifact of 10,000 characters is refused for its length, nothing queued.
func TestArtifactLengthIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	long := strings.Repeat("a", 10000) + "@sha256:" + strings.Repeat("0", 64)
	res := b.agent.Post("/v1/deploys", deployBody("api", "staging", long), apitest.Key("long")).Status(t, 422)
	if fields := problemFields(t, res); len(fields) != 1 || fields[0] != "artifact" || !strings.Contains(string(res.Body), "at most 512") {
		t.Errorf("long artifact: %s", res.Body)
	}
	if n := count(t, b.db, `SELECT count(*) FROM deploys`); n != 0 {
		t.Errorf("%d deploys queued", n)
	}
}

// TestApprovalExpiryIsRecordedOnce: an approval that runs out gets one `expired` record in its chain, whether
// two replicas' expiry workers race for it or a late decision finds it first; a late approve is refused with
// approval_invalid; the chains verify; and the timeline of the operation that finally ran shows the expired
// approval asked for its request, with its records, and verifies its chain too.
func TestApprovalExpiryIsRecordedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := context.Background()
	prod := deployBody("api", "production", artifact(1))
	expire := func(id string) {
		t.Helper()
		if err := b.db.Exec(`UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = ?`, id).Error; err != nil {
			t.Fatal(err)
		}
	}
	expiredRecords := func(id string) int {
		t.Helper()
		return count(t, b.db, `SELECT count(*) FROM approval_events WHERE approval_id = ? AND type = 'expired' AND actor = 'system:approval-expiry'`, id)
	}

	pending := requestApproval(t, b.agent, "/v1/deploys", "dep-1", prod)["id"].(string)
	unused := b.approved(t, "/v1/deploys", "other", prod)
	expire(pending)
	expire(unused)
	// Two replicas' workers at once, twice over.
	var moved atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			w := &approval.ExpiryWorker{DB: database.SQL(b.db), Interval: time.Second}
			for range 2 {
				moved.Add(int64(w.RunOnce(ctx)))
			}
		})
	}
	wg.Wait()
	if moved.Load() != 2 || expiredRecords(pending) != 1 || expiredRecords(unused) != 1 {
		t.Fatalf("workers moved %d, expired records %d and %d, want 2, 1 and 1", moved.Load(), expiredRecords(pending), expiredRecords(unused))
	}
	if n := count(t, b.db, `SELECT count(*) FROM approvals WHERE id IN (?, ?) AND state = 'expired'`, pending, unused); n != 2 {
		t.Fatalf("%d approvals stored expired, want 2", n)
	}
	if state := b.agent.Get("/v1/approvals/"+pending).Status(t, 200).Str(t, "state"); state != "expired" {
		t.Fatalf("expired approval reads %s", state)
	}
	// A late approve is refused, and records nothing more.
	if code := b.approver.Post("/v1/approvals/"+pending+"/approve", nil).Status(t, 403).Str(t, "code"); code != "approval_invalid" {
		t.Fatalf("late approve: %s", code)
	}
	if code := b.approver.Post("/v1/approvals/"+unused+"/revoke", nil).Status(t, 403).Str(t, "code"); code != "approval_invalid" {
		t.Fatalf("late revoke: %s", code)
	}

	// Ran out, and no worker came by yet: the late approve records the expiry itself, in its transaction.
	late := requestApproval(t, b.agent, "/v1/deploys", "dep-1", prod)["id"].(string)
	expire(late)
	if code := b.approver.Post("/v1/approvals/"+late+"/approve", nil).Status(t, 403).Str(t, "code"); code != "approval_invalid" {
		t.Fatalf("late approve before the worker: %s", code)
	}
	b.approver.Post("/v1/approvals/"+late+"/approve", nil).Status(t, 403)
	if n := (&approval.ExpiryWorker{DB: database.SQL(b.db)}).RunOnce(ctx); n != 0 || expiredRecords(late) != 1 {
		t.Fatalf("after a late approve: worker moved %d, %d expired records, want 0 and 1", n, expiredRecords(late))
	}
	if n := count(t, b.db, `SELECT count(*) FROM approval_events WHERE type = 'approved' AND approval_id IN (?, ?)`, pending, late); n != 0 {
		t.Fatalf("%d approved records of expired approvals", n)
	}

	// The write finally runs under a fresh approval; its timeline shows all three asked for its request.
	fresh := b.approved(t, "/v1/deploys", "dep-1", prod)
	opID := b.agent.Post("/v1/deploys", prod, apitest.Key("dep-1"), approvalID(fresh)).Status(t, 202).Header.Get("Operation-Id")
	var tl opstatus.Timeline
	b.agent.Get("/v1/operations/"+opID+"/timeline").Status(t, 200).Decode(t, &tl)
	if !tl.Chain.Intact || len(tl.Approvals) != 3 {
		t.Fatalf("timeline: chain %+v, %d approvals, want intact and 3", tl.Chain, len(tl.Approvals))
	}
	for _, a := range tl.Approvals {
		var types []string
		for _, r := range a.Records {
			types = append(types, r.Type)
		}
		want := "requested,expired"
		if a.ApprovalID == fresh {
			want = "requested,approved,used"
		}
		if strings.Join(types, ",") != want || (a.ApprovalID != fresh && a.State != "expired") {
			t.Errorf("approval %s in the timeline: state %s, records %v, want %s", a.ApprovalID, a.State, types, want)
		}
	}
	// The timeline checked the approvals' chains: records of the operation's chain plus theirs.
	ops := count(t, b.db, `SELECT count(*) FROM operation_events WHERE operation_id = ?`, opID)
	if want := ops + 2 + 2 + 3; tl.Chain.Records != want {
		t.Errorf("timeline checked %d records, want %d (the operation's and its approvals')", tl.Chain.Records, want)
	}
	rep, err := audit.Verify(ctx, testdb.Pool(t, b.db), audit.VerifyOptions{})
	if err != nil || !rep.Intact() {
		t.Fatalf("audit verify: %v %+v", err, rep.Problems)
	}
	// A tampered expiry record, once sealed, is caught by the timeline's check.
	testdb.SealAll(t, &audit.Sequencer{DB: testdb.Pool(t, b.db)})
	b.env.DB.Tampered()
	if err := b.db.Exec(`ALTER TABLE approval_events DISABLE TRIGGER approval_events_append_only`).Error; err != nil {
		t.Fatal(err)
	}
	tamper := b.db.Exec(`UPDATE approval_events SET actor = 'approver:mallory' WHERE approval_id = ? AND type = 'expired'`, late).Error
	// The schema is lent to the next test: it gets its trigger back.
	if err := b.db.Exec(`ALTER TABLE approval_events ENABLE TRIGGER approval_events_append_only`).Error; err != nil || tamper != nil {
		t.Fatal(err, tamper)
	}
	b.agent.Get("/v1/operations/"+opID+"/timeline").Status(t, 200).Decode(t, &tl)
	if tl.Chain.Intact {
		t.Error("the timeline did not notice a changed record of its approval's chain")
	}
}

// TestServedApprovalsExpireOnRecord: the expiry worker runs with every served set of services (beside the
// recovery worker), and records an approval that ran out without anyone asking.
func TestServedApprovalsExpireOnRecord(t *testing.T) {
	t.Parallel()
	b := setup(t, options{recovery: 20 * time.Millisecond})
	id := requestApproval(t, b.agent, "/v1/deploys", "served", deployBody("api", "production", artifact(1)))["id"].(string)
	if err := b.db.Exec(`UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = ?`, id).Error; err != nil {
		t.Fatal(err)
	}
	servicetest.Eventually(t, "the expiry worker records the approval expired", func() bool {
		return count(t, b.db, `SELECT count(*) FROM approvals WHERE id = ? AND state = 'expired'`, id) == 1
	})
	if n := count(t, b.db, `SELECT count(*) FROM approval_events WHERE approval_id = ? AND type = 'expired'`, id); n != 1 {
		t.Fatalf("%d expired records, want 1", n)
	}
}

// TestApprovalNumbersAreExactOrRefused: a number in an approval request reaches the approver's card and the audit
// record exactly, or is refused at the edge. expected_environment_version of 2^53+1 or the int64 maximum cannot
// be held exactly by RFC 8785 (IEEE 754 doubles): 422 validation_failed naming the field, nothing stored. 10^16
// and 10^17 can: the approval shows them digit for digit, the deploy it approves runs, and audit verify (the Go
// canonical form against the trigger's) stays intact.
func TestApprovalNumbersAreExactOrRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, version := range []string{"9007199254740993", "9223372036854775807"} {
		body := deployBody("api", "production", artifact(1), `"expected_environment_version":`+version)
		req := fmt.Sprintf(`{"method":"POST","path":"/v1/deploys","idempotency_key":"k-%s","body":%s}`, version, body)
		res := b.agent.Post("/v1/approvals", req, apitest.Key("inexact-"+version)).Status(t, 422)
		if code, fields := res.Str(t, "code"), problemFields(t, res); code != "validation_failed" ||
			len(fields) != 1 || fields[0] != "body.expected_environment_version" {
			t.Errorf("version %s: %s", version, res.Body)
		}
	}
	if n := count(t, b.db, `SELECT count(*) FROM approvals`) + count(t, b.db, `SELECT count(*) FROM operations`); n != 0 {
		t.Fatalf("%d approvals and operations stored for refused numbers", n)
	}

	for i, version := range []string{"10000000000000000", "100000000000000000"} {
		env := fmt.Sprintf("production-%d", i)
		exec := func(q string, args ...any) {
			if err := b.db.Exec(q, args...).Error; err != nil {
				t.Fatal(err)
			}
		}
		// An environment that has come that far: the version the card shows is the server's number as well.
		exec(`INSERT INTO environments (account_id, name, version) VALUES (?, ?, ?::bigint)`, servicetest.AccountDemo, env, version)
		body := deployBody("api", env, artifact(1), `"expected_environment_version":`+version)
		id := b.approved(t, "/v1/deploys", "exact-"+version, body)
		var shown struct {
			Summary struct {
				Expected json.Number `json:"expected_environment_version"`
				Current  json.Number `json:"environment_version"`
			} `json:"summary"`
		}
		dec := json.NewDecoder(strings.NewReader(string(b.approver.Get("/v1/approvals/"+id).Status(t, 200).Body)))
		dec.UseNumber()
		if err := dec.Decode(&shown); err != nil {
			t.Fatal(err)
		}
		if shown.Summary.Expected.String() != version || shown.Summary.Current.String() != version {
			t.Errorf("version %s: the approver is shown %+v", version, shown.Summary)
		}
		if n := count(t, b.db, `SELECT count(*) FROM approvals WHERE id = ? AND strpos(body, ?) > 0`, id,
			`"expected_environment_version":`+version); n != 1 {
			t.Errorf("version %s: the body the approver reads does not carry it exactly", version)
		}
		b.agent.Post("/v1/deploys", body, apitest.Key("exact-"+version), approvalID(id)).Status(t, 202)
	}
	rep, err := audit.Verify(context.Background(), testdb.Pool(t, b.db), audit.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Intact() || rep.Records == 0 {
		t.Fatalf("audit verify after exact large numbers: %+v", rep)
	}
}

// TestApprovalBindsTheEnvironmentVersionItShowed: what an approver decides on includes the environment as the
// card showed it (its version, what the deploy replaces, whether it can be rolled back), not only the request.
// A production deploy approved without expected_environment_version at version 0 ("cannot roll back") is
// refused once another deploy has run there first: 409 environment_version_mismatch, nothing deployed, the
// approval left unused. A request naming another version than the environment's is refused when the approval
// is asked for (it could never be used). Asked for again, at the version it now shows, it runs.
func TestApprovalBindsTheEnvironmentVersionItShowed(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	prod := func(n int) string { return deployBody("api", "production", artifact(n)) }
	first := requestApproval(t, b.agent, "/v1/deploys", "first", prod(1))
	if s := first["summary"].(map[string]any); s["environment_version"] != float64(0) || s["can_roll_back"] != false {
		t.Fatalf("the card of the first deploy: %v", s)
	}
	firstID := first["id"].(string)
	b.approver.Post("/v1/approvals/"+firstID+"/approve", nil).Status(t, 200)

	b.agent.Post("/v1/deploys", prod(2), apitest.Key("second"), approvalID(b.approved(t, "/v1/deploys", "second", prod(2)))).Status(t, 202)
	b.runOnce(t)

	res := b.agent.Post("/v1/deploys", prod(1), apitest.Key("first"), approvalID(firstID)).Status(t, 409)
	if code := res.Str(t, "code"); code != "environment_version_mismatch" {
		t.Fatalf("the approved deploy over one that ran since: %s", res.Body)
	}
	if n := count(t, b.db, `SELECT count(*) FROM deploys`); n != 1 {
		t.Fatalf("%d deploys, want only the one that ran", n)
	}
	if n := count(t, b.db, `SELECT count(*) FROM approvals WHERE id = ? AND used_by_operation_id IS NULL`, firstID); n != 1 {
		t.Fatal("the refused deploy used its approval")
	}
	if env := environment(t, b.agent, "production"); env.Version != 1 || *env.CurrentArtifact != artifact(2) {
		t.Fatalf("environment: %+v", env)
	}

	stale := fmt.Sprintf(`{"method":"POST","path":"/v1/deploys","idempotency_key":"stale","body":%s}`,
		deployBody("api", "production", artifact(3), `"expected_environment_version":0`))
	if code := b.agent.Post("/v1/approvals", stale, apitest.Key("stale")).Status(t, 409).Str(t, "code"); code != "environment_version_mismatch" {
		t.Fatalf("an approval asked for at a version the environment has left: %s", code)
	}

	again := requestApproval(t, b.agent, "/v1/deploys", "first-again", prod(1))
	if s := again["summary"].(map[string]any); s["environment_version"] != float64(1) || s["can_roll_back"] != true {
		t.Fatalf("the card of the deploy asked for again: %v", s)
	}
	b.approver.Post("/v1/approvals/"+again["id"].(string)+"/approve", nil).Status(t, 200)
	b.agent.Post("/v1/deploys", prod(1), apitest.Key("first-again"), approvalID(again["id"].(string))).Status(t, 202)
	if n := count(t, b.db, `SELECT count(*) FROM approvals WHERE state = 'approved' AND used_by_operation_id IS NOT NULL`); n != 2 {
		t.Fatalf("%d approvals used, want 2", n)
	}
}

// TestApprovalPathMustBeCanonical: the path an approver reads is the one the write is sent to, written one way.
// Another spelling of a route (a trailing or doubled slash, a dot segment) is refused, 422 naming path, and
// nothing is stored.
func TestApprovalPathMustBeCanonical(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	prod := deployBody("api", "production", artifact(1))
	for _, path := range []string{"/v1/deploys/", "//v1/deploys", "/v1//deploys", "/v1/./deploys", "/v1/x/../deploys", "v1/deploys",
		"/v1/deploys/dep_01a235a1-6af9-740b-8fe1-0777445c498e/rollback/"} {
		body := fmt.Sprintf(`{"method":"POST","path":%q,"idempotency_key":"k","body":%s}`, path, prod)
		res := b.agent.Post("/v1/approvals", body, apitest.Key("path")).Status(t, 422)
		if fields := problemFields(t, res); len(fields) != 1 || fields[0] != "path" {
			t.Errorf("path %q: fields %v: %s", path, fields, res.Body)
		}
	}
	if n := count(t, b.db, `SELECT count(*) FROM approvals`); n != 0 {
		t.Errorf("%d approvals stored for other spellings of a path", n)
	}
}
