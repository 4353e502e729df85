package failovertest

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retrysafe/retrysafe/services/payments"
)

// sweepResult is what `retrysafe payments-sweep` prints.
type sweepResult struct {
	Effects   int  `json:"effects"`
	Matched   int  `json:"matched"`
	Restored  int  `json:"restored"`
	ForPerson int  `json:"for_person"`
	InFlight  int  `json:"in_flight"`
	Unmatched int  `json:"unmatched"`
	Failover  bool `json:"failover"`
}

// sweep runs `retrysafe payments-sweep` on the database at url (the services' own sweep workers may have healed
// some effects already; this one finishes the work and says what is left).
func (s *stack) sweep(t *testing.T, url, providerURL string) sweepResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bin, "payments-sweep")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + url, "LOG_LEVEL=warn",
		"PROVIDER_URL=" + providerURL, "PROVIDER_SECRET=" + merchantSecret}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("retrysafe payments-sweep: %v\n%s", err, out)
	}
	var res sweepResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("retrysafe payments-sweep printed %s: %v", out, err)
	}
	return res
}

// healed is the healing step of an asynchronous failover, before anything is sent again: once the recovery
// workers have settled every payment left unknown by the kill, the sweep restores what the old primary took with
// it, and the books equal the provider's: every authorization the provider holds is one intent, with its status
// and captured amount. It returns how many effects the sweeps (the services' and this one) restored.
func healed(t *testing.T, s *stack, db *pgx.Conn, url string) int {
	t.Helper()
	until(t, "no payment reserved or unknown", 2*time.Minute, func() bool {
		return count(t, db, `SELECT count(*) FROM payment_intents WHERE status IN ('authorizing', 'capturing', 'canceling')`) == 0 &&
			count(t, db, `SELECT count(*) FROM operations WHERE kind LIKE 'payments.%' AND state IN ('running', 'unknown')`) == 0
	})
	res := s.sweep(t, url, s.providerURL)
	if res.Unmatched != 0 {
		t.Errorf("sweep after the failover = %+v; want every provider effect matched", res)
	}
	booksEqualProvider(t, s, db)
	return count(t, db, `SELECT count(*) FROM operations WHERE kind = $1 AND state = 'succeeded'`, payments.KindRestore)
}

// booksEqualProvider: every authorization the provider holds is one intent, with its status and captured amount.
func booksEqualProvider(t *testing.T, s *stack, db *pgx.Conn) {
	t.Helper()
	effects, err := s.provider.Effects(t.Context(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]string{"authorized": string(payments.StatusRequiresCapture), "captured": string(payments.StatusSucceeded),
		"voided": string(payments.StatusCanceled)}
	for _, e := range effects {
		if e.Kind != "authorize" {
			continue
		}
		a := e.Authorization
		n := count(t, db, `SELECT count(*) FROM payment_intents WHERE provider_authorization_id = $1 AND status = $2 AND captured_minor = $3`,
			a.ID, status[a.Status], a.CapturedMinor)
		if n != 1 {
			t.Errorf("authorization %s (%s, captured %d): %d intents book it so; want 1", a.ID, a.Status, a.CapturedMinor, n)
		}
	}
}
