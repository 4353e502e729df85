package main

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/metrics"
	"github.com/retrysafe/retrysafe/services/payments"
)

// sweepCommand runs the payments provider sweep once (services/payments/heal.go), as its worker does on a
// schedule and after a failover, and prints what it found: after a failover, an operator need not wait for it.
func sweepCommand() command {
	return command{
		name: "payments-sweep", synopsis: "payments-sweep",
		summary: "compare the provider's effects with the payments rows once, restore what a failover lost, print the counts",
		check:   noArgs("payments-sweep"), run: runSweep,
		env: databaseEnv + `
  PROVIDER_URL PROVIDER_SECRET PROVIDER_TIMEOUT   as for serve
` + commonEnv,
	}
}

func runSweep(ctx context.Context, inv invocation) error {
	db, err := openDB(inv.cfg)
	if err != nil {
		return err
	}
	h, err := idem.New(db)
	if err != nil {
		return err
	}
	pool, err := database.PoolOf(db)
	if err != nil {
		return err
	}
	cfg := inv.cfg
	cfg.PaymentsSweepInterval = 0 // this command sweeps once, itself
	svc, err := buildPayments(cfg, service.Deps{DB: db, Pool: pool, Logger: inv.logger, Metrics: metrics.New(), Idem: h})
	if err != nil {
		return err
	}
	pay, ok := svc.(*payments.Server)
	if !ok {
		return errors.New("payments-sweep: the payments service is not *payments.Server")
	}
	res, err := pay.SweepProvider(ctx)
	if err != nil {
		return err
	}
	return json.NewEncoder(inv.stdout).Encode(map[string]any{"effects": res.Effects, "matched": res.Matched,
		"restored": res.Restored, "for_person": res.ForPerson, "in_flight": res.InFlight, "unmatched": res.Unmatched(),
		"timeline": res.Timeline, "failover": res.Failover})
}
