package payments_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/money"
	"github.com/retrysafe/retrysafe/pkg/problem"
	"github.com/retrysafe/retrysafe/services/payments"
)

// FuzzIntentAmount drives the amount of POST /v1/payment_intents through the request's Command, as the handler
// does. Whatever the input, the result is a command with an amount in (0, MaxMinor] or a 422 naming a field; an
// accepted decimal means the same request as its minor units and as its spelling with one more trailing zero
// where the currency allows it (one fingerprint). `go test` runs the seeds; `go test -fuzz FuzzIntentAmount`
// explores.
func FuzzIntentAmount(f *testing.F) {
	for _, seed := range []struct{ currency, amount string }{
		{"USD", "12.3"}, {"USD", "12.30"}, {"USD", "0.01"}, {"USD", "0"}, {"USD", "-1"}, {"USD", "1e2"},
		{"USD", "90071992547409.91"}, {"USD", "90071992547409.92"}, {"USD", "007"}, {"USD", "1."},
		{"JPY", "1000"}, {"JPY", "1.0"}, {"KWD", "1.5"}, {"KWD", "1.5000"}, {"EUR", " 1"}, {"usd", "1"},
	} {
		f.Add(seed.currency, seed.amount)
	}
	f.Fuzz(func(t *testing.T, currency, amount string) {
		req := payments.CreateIntentRequest{OrderID: "o", Amount: &amount, Currency: currency}
		cmd, err := req.Command()
		if err != nil {
			var pe *problem.Error
			if !errors.As(err, &pe) || pe.Code != "validation_failed" || len(pe.Fields) == 0 {
				t.Fatalf("Command(%q %q) error %v is not a validation failure", currency, amount, err)
			}
			return
		}
		if cmd.AmountMinor <= 0 || cmd.AmountMinor > money.MaxMinor || cmd.Currency != currency {
			t.Fatalf("Command(%q %q) = %+v", currency, amount, cmd)
		}
		fp := fingerprint(t, cmd)
		minor := cmd.AmountMinor
		byMinor, err := payments.CreateIntentRequest{OrderID: "o", AmountMinor: &minor, Currency: currency}.Command()
		if err != nil || fingerprint(t, byMinor) != fp {
			t.Fatalf("amount %q and amount_minor %d are different requests: %+v, %v", amount, minor, byMinor, err)
		}
		exp, _ := money.Exponent(currency)
		_, frac, hasDot := strings.Cut(amount, ".")
		longer := amount + "0"
		if !hasDot {
			longer = amount + ".0"
		}
		// One more zero is the same amount, unless it makes the string longer than any amount may be spelled.
		if len(frac) < exp && len(longer) <= money.MaxDecimalLen {
			again, err := payments.CreateIntentRequest{OrderID: "o", Amount: &longer, Currency: currency}.Command()
			if err != nil || fingerprint(t, again) != fp {
				t.Fatalf("%q and %q %s are different requests: %+v, %v", amount, longer, currency, again, err)
			}
		}
	})
}

func fingerprint(t *testing.T, cmd payments.CreateIntent) string {
	t.Helper()
	fp, err := idem.Fingerprint("POST", "/v1/payment_intents", nil, "acct", cmd)
	if err != nil {
		t.Fatal(err)
	}
	return fp
}
