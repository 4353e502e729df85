package deploys_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/services/deploys"
)

func TestCancelIsADeclaredFinalState(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	d := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(1)), apitest.Key("k1")).Status(t, 202))

	first := decodeDeploy(t, b.agent.Post("/v1/deploys/"+d.ID+"/cancel", nil).Status(t, 200))
	second := decodeDeploy(t, b.agent.Post("/v1/deploys/"+d.ID+"/cancel", nil).Status(t, 200))
	if first.State != deploys.StateCancelled || second.State != deploys.StateCancelled || len(second.History) != len(first.History) {
		t.Fatalf("cancel twice: %s (%d events), %s (%d events)", first.State, len(first.History), second.State, len(second.History))
	}
	if n := finalEvents(t, b.db, d.OperationID); n != 1 {
		t.Fatalf("%d final events, want 1", n)
	}
	if env := environment(t, b.agent, "staging"); env.Lock != nil || env.Version != 0 {
		t.Fatalf("after cancel: %+v", env)
	}
	// The lock is free for the next deploy, and the controller never picks the cancelled one up.
	next := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", "staging", artifact(2)), apitest.Key("k2")).Status(t, 202))
	if next.FencingToken != 2 {
		t.Fatalf("fencing token %d, want 2", next.FencingToken)
	}
	b.runOnce(t)
	if _, found, _ := b.target.Activation(t.Context(), d.ID); found {
		t.Fatal("the cancelled deploy was activated")
	}
	// A finished deploy cannot be cancelled.
	res := b.agent.Post("/v1/deploys/"+next.ID+"/cancel", nil).Status(t, 409)
	if res.Str(t, "code") != "invalid_state" || res.Str(t, "state") != "succeeded" {
		t.Fatalf("cancel after success: %s", res.Body)
	}
	b.agent.Post("/v1/deploys/nope/cancel", nil).Status(t, 404)
	b.agent.As("other-agent-secret").Post("/v1/deploys/"+d.ID+"/cancel", nil).Status(t, 404)
}

// Cancels fired while the controller runs deploys to completion: whichever wins, each deploy ends in exactly one
// final state with exactly one final event, and the target, the environment and the lock agree with it.
func TestCancelRacingCompletionEndsInOneFinalState(t *testing.T) {
	t.Parallel()
	b := setup(t, options{background: true})
	const rounds = 8
	outcomes := map[deploys.State]int{}
	for i := range rounds {
		envName := fmt.Sprintf("race-%d", i)
		d := decodeDeploy(t, b.agent.Post("/v1/deploys", deployBody("api", envName, artifact(i)), apitest.Key(envName)).Status(t, 202))
		time.Sleep(time.Duration(rand.IntN(120)) * time.Millisecond) // spread the cancels over the deploy's life
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				res := b.agent.Post("/v1/deploys/"+d.ID+"/cancel", nil)
				if res.Code != 200 && !(res.Code == 409 && res.Str(t, "code") == "invalid_state") {
					t.Errorf("cancel: %d %s", res.Code, res.Body)
				}
			})
		}
		wg.Wait()
		final := waitFinal(t, b.agent, d.ID)
		outcomes[final.State]++
		if n := finalEvents(t, b.db, d.OperationID); n != 1 {
			t.Fatalf("round %d: %d final events, want 1", i, n)
		}
		marker, activated, err := b.target.Activation(t.Context(), d.ID)
		if err != nil {
			t.Fatal(err)
		}
		env := environment(t, b.agent, envName)
		switch final.State {
		case deploys.StateSucceeded:
			if !activated || marker.Calls != 1 || env.Version != 1 || env.Lock != nil {
				t.Fatalf("round %d succeeded: marker %+v (%v), env %+v", i, marker, activated, env)
			}
		case deploys.StateCancelled:
			if activated || env.Version != 0 || env.Lock != nil {
				t.Fatalf("round %d cancelled: marker %+v (%v), env %+v", i, marker, activated, env)
			}
		default:
			t.Fatalf("round %d: final state %s", i, final.State)
		}
	}
	t.Logf("outcomes: %v", outcomes)
}
