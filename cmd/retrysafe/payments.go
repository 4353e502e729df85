package main

import (
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/pkg/money"
	"github.com/retrysafe/retrysafe/pkg/tracing"
	"github.com/retrysafe/retrysafe/services/payments"
	"github.com/retrysafe/retrysafe/services/provider"
)

// defaultApprovalThresholds is PAYMENTS_APPROVAL_THRESHOLDS when unset: captures and refunds (their running
// total per intent) above 1,000.00 in the major two-decimal currencies, 100,000 JPY or 1,000,000 KRW need a
// person's approval. A currency that is not listed needs approval for any amount: the rule fails closed.
const defaultApprovalThresholds = "USD:100000,EUR:100000,GBP:100000,CHF:100000,CAD:100000,AUD:100000,JPY:100000,KRW:1000000"

// thresholds reads PAYMENTS_APPROVAL_THRESHOLDS: "USD:100000,JPY:100000" (minor units per ISO 4217 currency).
func (r *envReader) thresholds(name, def string) map[string]int64 {
	out := map[string]int64{}
	for _, entry := range strings.Split(r.str(name, def), ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		currency, limit, ok := strings.Cut(entry, ":")
		n, err := strconv.ParseInt(limit, 10, 64)
		if _, known := money.Exponent(currency); !ok || !known || err != nil || n < 0 || n > money.MaxMinor {
			r.fail(name, "entry %q is not CURRENCY:minor_units (such as USD:100000)", entry)
			continue
		}
		out[currency] = n
	}
	return out
}

func buildPayments(cfg config, d service.Deps) (service.Service, error) {
	listed := make([]string, 0, len(cfg.PaymentsApprovalThresholds))
	for currency := range cfg.PaymentsApprovalThresholds {
		listed = append(listed, currency)
	}
	slices.Sort(listed)
	d.Log().Info("payments: captures and refunds in a currency not listed in PAYMENTS_APPROVAL_THRESHOLDS need approval above zero",
		"listed", strings.Join(listed, ","))
	return payments.New(d, payments.Config{
		// The provider's calls carry the request's trace (pkg/tracing; passed straight through when it is off).
		Provider: provider.NewClientHTTP(cfg.ProviderURL, cfg.ProviderSecret,
			&http.Client{Timeout: cfg.ProviderTimeout, Transport: tracing.Transport(nil)}).
			WithObserver(d.Metrics.Downstream("provider")),
		ApprovalThresholds: cfg.PaymentsApprovalThresholds,
		ApprovalTTL:        cfg.ApprovalTTL,
	})
}
