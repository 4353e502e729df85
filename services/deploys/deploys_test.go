package deploys_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/services/deploys"
)

func TestMutableReferencesAreRefusedWithoutBurningTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	digest := strings.Repeat("ab", 32)
	refused := []struct{ name, body, field string }{
		{"tag", `{"service":"api","environment":"staging","artifact":"registry.example.com/shop/api:1.4.2"}`, "artifact"},
		{"latest", `{"service":"api","environment":"staging","artifact":"api:latest"}`, "artifact"},
		{"bare name", `{"service":"api","environment":"staging","artifact":"api"}`, "artifact"},
		{"tag and digest", `{"service":"api","environment":"staging","artifact":"api:1.4@sha256:` + digest + `"}`, "artifact"},
		{"uppercase digest", `{"service":"api","environment":"staging","artifact":"api@sha256:` + strings.ToUpper(digest) + `"}`, "artifact"},
		{"short digest", `{"service":"api","environment":"staging","artifact":"api@sha256:` + digest[:12] + `"}`, "artifact"},
		{"md5 digest", `{"service":"api","environment":"staging","artifact":"api@md5:` + digest[:32] + `"}`, "artifact"},
		{"branch", `{"service":"api","environment":"staging","commit_sha":"main"}`, "commit_sha"},
		{"short sha", `{"service":"api","environment":"staging","commit_sha":"a1b2c3d"}`, "commit_sha"},
		{"uppercase sha", `{"service":"api","environment":"staging","commit_sha":"ABCDEF` + strings.Repeat("0", 34) + `"}`, "commit_sha"},
		{"41 hex", `{"service":"api","environment":"staging","commit_sha":"` + commit(7) + `a"}`, "commit_sha"},
	}
	for _, tc := range refused {
		res := b.agent.Post("/v1/deploys", tc.body, apitest.Key("ref-key")).Status(t, 422)
		if code := res.Str(t, "code"); code != "mutable_reference" {
			t.Errorf("%s: code %q, want mutable_reference", tc.name, code)
		}
		if fields := problemFields(t, res); !slices.Equal(fields, []string{tc.field}) {
			t.Errorf("%s: errors name %v, want [%s]", tc.name, fields, tc.field)
		}
	}
	invalid := []string{
		`{"service":"api","environment":"staging"}`,
		`{"service":"api","environment":"staging","artifact":"api@sha256:` + digest + `","commit_sha":"` + commit(1) + `"}`,
		`{"service":"API","environment":"staging","commit_sha":"` + commit(1) + `"}`,
		`{"service":"api","environment":"staging","commit_sha":"` + commit(1) + `","expected_environment_version":-1}`,
	}
	for _, body := range invalid {
		if code := b.agent.Post("/v1/deploys", body, apitest.Key("ref-key")).Status(t, 422).Str(t, "code"); code != "validation_failed" {
			t.Errorf("%s: code %q, want validation_failed", body, code)
		}
	}
	if n := count(t, b.db, `SELECT count(*) FROM deploys`) + count(t, b.db, `SELECT count(*) FROM operations WHERE key_state IS NOT NULL`); n != 0 {
		t.Fatalf("%d deploys or keys stored for refused requests", n)
	}

	// The key stayed free, and every immutable form is accepted.
	accepted := []string{
		deployBody("api", "staging", "api@sha256:"+digest),
		deployBody("api", "qa", "registry.example.com:5000/shop/api@sha512:"+strings.Repeat("0f", 64)),
		deployBody("api", "dev", commit(1)),
		deployBody("api", "perf", strings.Repeat("c0", 32)),
	}
	for i, body := range accepted {
		key := "ref-key"
		if i > 0 {
			key = fmt.Sprintf("ref-key-%d", i)
		}
		res := b.agent.Post("/v1/deploys", body, apitest.Key(key)).Status(t, 202)
		if d := decodeDeploy(t, res); d.State != deploys.StateQueued || res.Header.Get("Location") != "/v1/deploys/"+d.ID {
			t.Errorf("%s: state %s, Location %q", body, d.State, res.Header.Get("Location"))
		}
	}
}

func TestSameKeyReplaysEquivalentJSONAndRefusesAnotherDigest(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	first := b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(1)), apitest.Key("k1")).Status(t, 202)
	equivalent := fmt.Sprintf(`{ "artifact" : %q,
		"environment":"staging",   "service":"api" }`, artifact(1))
	replay := b.agent.Post("/v1/deploys", equivalent, apitest.Key("k1")).Status(t, 202)
	if replay.Header.Get("Idempotent-Replayed") != "true" || string(replay.Body) != string(first.Body) {
		t.Fatalf("equivalent JSON was not a byte-for-byte replay:\n%s\n%s", first.Body, replay.Body)
	}
	if replay.Header.Get("Location") != first.Header.Get("Location") || replay.Header.Get("Operation-Id") != first.Header.Get("Operation-Id") {
		t.Fatalf("replay headers differ: %v vs %v", replay.Header, first.Header)
	}
	reused := b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(2)), apitest.Key("k1")).Status(t, 422)
	if reused.Str(t, "code") != "idempotency_key_reused" || reused.Str(t, "operation_id") != first.Header.Get("Operation-Id") {
		t.Fatalf("another digest under the same key: %s", reused.Body)
	}
	if n := count(t, b.db, `SELECT count(*) FROM deploys`); n != 1 {
		t.Fatalf("%d deploys, want 1", n)
	}
	if n := count(t, b.db, `SELECT count(*) FROM operation_events WHERE type = 'conflict_rejected'`); n != 1 {
		t.Fatalf("%d conflict_rejected events, want 1", n)
	}
}

func TestDeploysRacingForOneEnvironmentGetOneLock(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	const racers = 4
	var (
		start   sync.WaitGroup
		done    sync.WaitGroup
		results [racers]*apitest.Response
	)
	start.Add(1)
	for i := range racers {
		done.Go(func() {
			start.Wait()
			results[i] = b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(i)), apitest.Key(fmt.Sprintf("race-%d", i)))
		})
	}
	start.Done()
	done.Wait()

	var winner string
	for _, res := range results {
		if res.Code == http.StatusAccepted {
			if winner != "" {
				t.Fatal("two deploys accepted for one environment")
			}
			winner = decodeDeploy(t, res).ID
		}
	}
	if winner == "" {
		t.Fatal("no deploy accepted")
	}
	for _, res := range results {
		if res.Code == http.StatusAccepted {
			continue
		}
		res.Status(t, 409)
		if res.Str(t, "code") != "environment_locked" || res.Str(t, "holder_deploy_id") != winner || res.Header.Get("Retry-After") == "" {
			t.Fatalf("loser: %v %s", res.Header, res.Body)
		}
	}
	if n := count(t, b.db, `SELECT count(*) FROM deploys`); n != 1 {
		t.Fatalf("%d deploys, want 1", n)
	}
	env := environment(t, b.agent, "staging")
	if env.Lock == nil || env.Lock.HolderDeployID != winner || env.Lock.FencingToken != 1 {
		t.Fatalf("lock: %+v", env.Lock)
	}
	// The losers' keys stayed free: once the holder is done, a retry with the same key goes through.
	b.runOnce(t)
	for i, res := range results {
		if res.Code == http.StatusConflict {
			b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(i)), apitest.Key(fmt.Sprintf("race-%d", i))).Status(t, 202)
			break
		}
	}
}

// The seed's story: the agent starts dep-118 for commit a1b2c3, the controller accepts it, the answer is lost;
// the agent assumes failure and plans dep-119 for the newer commit d4e5f6 under a new key. An idempotency key
// only stops a true retry of dep-118; the release lock or the expected version stops the conflicting plan.
func TestLostAnswerThenNewerPlanIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	a1b2c3, d4e5f6 := "a1b2c3"+strings.Repeat("0", 34), "d4e5f6"+strings.Repeat("0", 34)
	plan118 := deployBody("shop", "production-eu", a1b2c3, `"expected_environment_version":0`)
	plan119 := deployBody("shop", "production-eu", d4e5f6, `"expected_environment_version":0`)

	dep118 := decodeDeploy(t, b.agent.Post("/v1/deploys", plan118, apitest.Key("dep-118")).Status(t, 202))
	// ... the answer never reached the agent. It plans dep-119 while dep-118 is queued: the lock refuses it.
	locked := b.agent.Post("/v1/deploys", plan119, apitest.Key("dep-119")).Status(t, 409)
	if locked.Str(t, "code") != "environment_locked" || locked.Str(t, "holder_deploy_id") != dep118.ID {
		t.Fatalf("dep-119 while dep-118 is queued: %s", locked.Body)
	}

	b.runOnce(t) // dep-118 runs to success
	// Retried after dep-118 finished, the stale plan is refused by the expected version.
	mismatch := b.agent.Post("/v1/deploys", plan119, apitest.Key("dep-119")).Status(t, 409)
	if mismatch.Str(t, "code") != "environment_version_mismatch" || mismatch.JSON(t)["current_version"] != float64(1) {
		t.Fatalf("dep-119 after dep-118 succeeded: %s", mismatch.Body)
	}
	// The true retry of dep-118 gets its original answer.
	retry := b.agent.Post("/v1/deploys", plan118, apitest.Key("dep-118")).Status(t, 202)
	if decodeDeploy(t, retry).ID != dep118.ID || retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of dep-118: %s", retry.Body)
	}

	if n := count(t, b.db, `SELECT count(*) FROM deploys`); n != 1 {
		t.Fatalf("%d deploys, want only dep-118", n)
	}
	marker, found, err := b.target.Activation(t.Context(), dep118.ID)
	if err != nil || !found || marker.CommitSHA == nil || *marker.CommitSHA != a1b2c3 || marker.Calls != 1 {
		t.Fatalf("dep-118 marker: %+v found=%v err=%v", marker, found, err)
	}
	if n := count(t, b.db, `SELECT count(*) FROM deploy_target_activations`); n != 1 {
		t.Fatalf("the target activated %d deploys, want 1", n)
	}
	env := environment(t, b.agent, "production-eu")
	if env.Version != 1 || env.CurrentCommitSHA == nil || *env.CurrentCommitSHA != a1b2c3 || env.Lock != nil {
		t.Fatalf("environment: %+v", env)
	}
}

func TestControllerRunsADeployToSuccess(t *testing.T) {
	t.Parallel()
	b := setup(t, options{background: true})
	d := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(1)), apitest.Key("k")).Status(t, 202))
	final := waitFinal(t, b.agent, d.ID)
	if final.State != deploys.StateSucceeded || final.StepsCompleted != 2 || final.FinishedAt == nil {
		t.Fatalf("deploy: %+v", final.Deploy)
	}
	var types []string
	for _, ev := range final.History {
		types = append(types, ev.Type)
	}
	want := []string{"completed", "state_changed", "step_completed", "step_completed", "activation_started",
		"dispatch_started", "dispatch_response_received", "activated"}
	if !slices.Equal(types, want) {
		t.Fatalf("history %v, want %v", types, want)
	}
	env := environment(t, b.agent, "staging")
	if env.Version != 1 || env.CurrentDeployID == nil || *env.CurrentDeployID != d.ID || env.Lock != nil {
		t.Fatalf("environment: %+v", env)
	}
	op := b.agent.Get("/v1/operations/"+d.OperationID).Status(t, 200)
	if op.Str(t, "state") != "succeeded" || op.Str(t, "kind") != deploys.KindDeploy {
		t.Fatalf("operation: %s", op.Body)
	}
	b.agent.Get("/v1/deploys/nope").Status(t, 404)
	b.agent.Get("/v1/environments/nowhere").Status(t, 404)
	b.agent.As("other-agent-secret").Get("/v1/deploys/"+d.ID).Status(t, 404)
}

// TestFoldedDuplicateNamesAreRefused: encoding/json matches "ſervice" (U+017F LONG S) to service, as it
// matches K (U+212A KELVIN SIGN) to k, so {"service":"shop","ſervice":"evil"} would deploy evil while the card and every other
// reader show shop. Any name the decoder would match to a field without being its name is 400 naming it, for a
// deploy and for the approval of one, with no deploy, approval or key left behind.
func TestFoldedDuplicateNamesAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, body := range []string{
		`{"service":"shop","ſervice":"evil","environment":"staging","commit_sha":"` + commit(1) + `"}`,
		`{"ſervice":"evil","service":"shop","environment":"staging","commit_sha":"` + commit(1) + `"}`,
		`{"service":"shop","environment":"staging","commit_sha":"` + commit(1) + `","commit_\u017fha":"` + commit(2) + `"}`,
		`{"service":"shop","environment":"staging","commit_sha":"` + commit(1) + `","expected_environment_version":0,"expected_environment_ver\u017fion":3}`,
	} {
		res := b.agent.Post("/v1/deploys", body, apitest.Key("folded")).Status(t, http.StatusBadRequest)
		fields := problemFields(t, res)
		if res.Str(t, "code") != "invalid_request" || len(fields) != 1 || !strings.ContainsRune(fields[0], 'ſ') {
			t.Errorf("%s: %s; want invalid_request naming the folded member", body, res.Body)
		}
		req := fmt.Sprintf(`{"method":"POST","path":"/v1/deploys","idempotency_key":"folded","body":%s}`, body)
		if code := b.agent.Post("/v1/approvals", req, apitest.Key("approval-of-folded")).Status(t, http.StatusBadRequest).Str(t, "code"); code != "invalid_request" {
			t.Errorf("approval of %s: code %q, want invalid_request", body, code)
		}
	}
	if n := count(t, b.db, `SELECT count(*) FROM deploys`) + count(t, b.db, `SELECT count(*) FROM approvals`) +
		count(t, b.db, `SELECT count(*) FROM operations`); n != 0 {
		t.Fatalf("%d deploys, approvals or operations stored for refused requests", n)
	}
	b.agent.Post("/v1/deploys", deployBody("shop", "staging", commit(1)), apitest.Key("folded")).Status(t, http.StatusAccepted)
}
