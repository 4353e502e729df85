package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/retrysafe/retrysafe/pkg/money"
	"github.com/retrysafe/retrysafe/services/payments"
	"github.com/retrysafe/retrysafe/services/provider"
)

// defaultApprovalThresholds is PAYMENTS_APPROVAL_THRESHOLDS when unset: captures and refunds above 1,000.00 in
// the major two-decimal currencies, 100,000 JPY or 1,000,000 KRW need a person's approval. A currency that is
// not listed never needs one.
const defaultApprovalThresholds = "USD:100000,EUR:100000,GBP:100000,CHF:100000,CAD:100000,AUD:100000,JPY:100000,KRW:1000000"

// parseThresholds reads "USD:100000,JPY:100000" (minor units per ISO 4217 currency). It keeps the first error
// of the config reader, prev, when there is one.
func parseThresholds(spec string, prev error) (map[string]int64, error) {
	out := map[string]int64{}
	for _, entry := range strings.Split(spec, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		currency, limit, ok := strings.Cut(entry, ":")
		n, err := strconv.ParseInt(limit, 10, 64)
		if _, known := money.Exponent(currency); !ok || !known || err != nil || n < 0 || n > money.MaxMinor {
			if prev == nil {
				prev = fmt.Errorf("config: PAYMENTS_APPROVAL_THRESHOLDS entry %q is not CURRENCY:minor_units (such as USD:100000)", entry)
			}
			continue
		}
		out[currency] = n
	}
	return out, prev
}

func buildPayments(d deps) (service, error) {
	// The lease bounds how long a provider call may run before the reconciler may conclude it never executed;
	// a call allowed to outlive it could execute after that conclusion.
	if d.cfg.ProviderTimeout <= 0 || d.cfg.ProviderTimeout >= d.cfg.OperationLease {
		return service{}, fmt.Errorf("PROVIDER_TIMEOUT (%s) must be positive and below OPERATION_LEASE (%s)",
			d.cfg.ProviderTimeout, d.cfg.OperationLease)
	}
	r, err := router(d)
	if err != nil {
		return service{}, err
	}
	s := payments.New(payments.Config{
		DB:                 d.db,
		Store:              payments.PostgresStore{},
		Idem:               d.idem,
		Provider:           provider.NewClient(d.cfg.ProviderURL, d.cfg.ProviderSecret, d.cfg.ProviderTimeout),
		ApprovalThresholds: d.cfg.PaymentsApprovalThresholds,
		ApprovalTTL:        d.cfg.ApprovalTTL,
	})
	payments.Routes(r.API, s)
	return service{name: "payments", addr: d.cfg.PaymentsAddr, handler: r.Engine, reconcilers: s.Reconcilers()}, nil
}
