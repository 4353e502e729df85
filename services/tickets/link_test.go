package tickets_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/tickets"
)

// A create answered 200 deduplicated (same source_event_id under another key) names the operation that created
// the ticket, in its body and as an event, and both timelines link the two; a replay of the deduplicated key
// says the same without a second link.
func TestDeduplicatedCreateLinksTheCreator(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	body := `{"project":"ops","title":"Disk full on db-3","source_event_id":"alert-9"}`
	first := c.Post("/v1/tickets", body, apitest.Key("alert-a")).Status(t, http.StatusCreated)
	creator := first.Header.Get("Operation-Id")
	var created tickets.CreateResult
	first.Decode(t, &created)
	if created.DeduplicatedAgainst != "" {
		t.Errorf("a created ticket names deduplicated_against %q", created.DeduplicatedAgainst)
	}

	second := c.Post("/v1/tickets", body, apitest.Key("alert-b")).Status(t, http.StatusOK)
	dup := second.Header.Get("Operation-Id")
	var got tickets.CreateResult
	second.Decode(t, &got)
	if !got.Deduplicated || got.ID != created.ID || got.DeduplicatedAgainst != creator || dup == creator {
		t.Fatalf("deduplicated answer %s; want ticket %s against operation %s", second.Body, created.ID, creator)
	}
	replay := c.Post("/v1/tickets", body, apitest.Key("alert-b")).Status(t, http.StatusOK)
	if replay.Header.Get("Idempotent-Replayed") != "true" || replay.Str(t, "deduplicated_against") != creator {
		t.Errorf("replay %s", replay.Body)
	}

	var dupTL, creatorTL opstatus.Timeline
	c.Get("/v1/operations/"+dup+"/timeline").Status(t, http.StatusOK).Decode(t, &dupTL)
	c.Get("/v1/operations/"+creator+"/timeline").Status(t, http.StatusOK).Decode(t, &creatorTL)
	if dupTL.DeduplicatedAgainst == nil || *dupTL.DeduplicatedAgainst != creator || len(dupTL.DeduplicatedBy) != 0 {
		t.Errorf("timeline of the deduplicated operation: against %v, by %v", dupTL.DeduplicatedAgainst, dupTL.DeduplicatedBy)
	}
	if creatorTL.DeduplicatedAgainst != nil || len(creatorTL.DeduplicatedBy) != 1 || creatorTL.DeduplicatedBy[0] != dup {
		t.Errorf("timeline of the creator: against %v, by %v; want by [%s]", creatorTL.DeduplicatedAgainst, creatorTL.DeduplicatedBy, dup)
	}
	if !dupTL.Chain.Intact || !creatorTL.Chain.Intact {
		t.Errorf("chains: %+v %+v", dupTL.Chain, creatorTL.Chain)
	}
	if n := count(t, env, `SELECT count(*) FROM operation_events WHERE operation_id = ? AND type = 'deduplicated_by'`, creator); n != 1 {
		t.Errorf("deduplicated_by events on the creator = %d; want 1 (the replay adds none)", n)
	}
	if n := count(t, env, `SELECT count(*) FROM tickets WHERE source_event_id = 'alert-9'`); n != 1 {
		t.Errorf("tickets = %d; want 1", n)
	}
}

// Copies under many keys at once: every deduplicated one names the one creator, which lists each of them once.
func TestConcurrentDeduplicatedCreatesAllLinkTheCreator(t *testing.T) {
	t.Parallel()
	c, env := setup(t)
	const racers = 12
	body := `{"project":"ops","title":"Disk full","source_event_id":"alert-race"}`
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		creator string
		against = map[string]string{}
	)
	start := make(chan struct{})
	for i := range racers {
		wg.Go(func() {
			<-start
			res := c.Post("/v1/tickets", body, apitest.Key(fmt.Sprintf("race-%d", i)))
			var got tickets.CreateResult
			res.Decode(t, &got)
			mu.Lock()
			defer mu.Unlock()
			if res.Code == http.StatusCreated {
				creator = res.Header.Get("Operation-Id")
				return
			}
			against[res.Header.Get("Operation-Id")] = got.DeduplicatedAgainst
		})
	}
	close(start)
	wg.Wait()
	if creator == "" || len(against) != racers-1 {
		t.Fatalf("creator %q, deduplicated %d", creator, len(against))
	}
	for op, a := range against {
		if a != creator {
			t.Errorf("operation %s deduplicated against %q; want %s", op, a, creator)
		}
	}
	var tl opstatus.Timeline
	c.Get("/v1/operations/"+creator+"/timeline").Status(t, http.StatusOK).Decode(t, &tl)
	seen := map[string]bool{}
	for _, op := range tl.DeduplicatedBy {
		seen[op] = true
	}
	if len(tl.DeduplicatedBy) != racers-1 || len(seen) != racers-1 || !tl.Chain.Intact {
		t.Errorf("creator's timeline: deduplicated_by %v, chain %+v", tl.DeduplicatedBy, tl.Chain)
	}
	if n := count(t, env, `SELECT count(*) FROM tickets WHERE source_event_id = 'alert-race'`); n != 1 {
		t.Errorf("tickets = %d; want 1", n)
	}
}
