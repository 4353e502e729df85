package money_test

import (
	"errors"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/money"
)

func TestExponent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		currency string
		want     int
		ok       bool
	}{
		{"USD", 2, true},
		{"EUR", 2, true},
		{"JPY", 0, true},
		{"KRW", 0, true},
		{"XPF", 0, true},
		{"KWD", 3, true},
		{"TND", 3, true},
		{"usd", 0, false},
		{"XXX", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		got, ok := money.Exponent(tt.currency)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Exponent(%q) = %d, %t; want %d, %t", tt.currency, got, ok, tt.want, tt.ok)
		}
	}
}

func TestParseDecimal(t *testing.T) {
	t.Parallel()
	tests := []struct {
		currency, in string
		want         int64
		wantField    string // "" when the parse succeeds
	}{
		{"USD", "12.30", 1230, ""},
		{"USD", "12.3", 1230, ""},
		{"USD", "12", 1200, ""},
		{"USD", "0.5", 50, ""},
		{"USD", "0.01", 1, ""},
		{"USD", "012.30", 1230, ""},
		{"USD", "90071992547409.91", money.MaxMinor, ""},
		{"JPY", "1000", 1000, ""},
		{"KWD", "1.5", 1500, ""},
		{"KWD", "1.500", 1500, ""},
		{"KWD", "0.001", 1, ""},

		{"USD", "", 0, money.FieldAmount},
		{"USD", "0", 0, money.FieldAmount},
		{"USD", "0.00", 0, money.FieldAmount},
		{"USD", "-1", 0, money.FieldAmount},
		{"USD", "+1", 0, money.FieldAmount},
		{"USD", "1e3", 0, money.FieldAmount},
		{"USD", "1E3", 0, money.FieldAmount},
		{"USD", " 1", 0, money.FieldAmount},
		{"USD", "1 ", 0, money.FieldAmount},
		{"USD", "NaN", 0, money.FieldAmount},
		{"USD", "Infinity", 0, money.FieldAmount},
		{"USD", ".5", 0, money.FieldAmount},
		{"USD", "5.", 0, money.FieldAmount},
		{"USD", "1.2.3", 0, money.FieldAmount},
		{"USD", "1,00", 0, money.FieldAmount},
		{"USD", "0x10", 0, money.FieldAmount},
		{"USD", "12.345", 0, money.FieldAmount},
		{"USD", "12.300", 0, money.FieldAmount},
		{"JPY", "1.0", 0, money.FieldAmount},
		{"KWD", "1.0005", 0, money.FieldAmount},
		{"USD", "90071992547409.92", 0, money.FieldAmount},
		{"USD", "99999999999999999999999999", 0, money.FieldAmount},

		{"usd", "1", 0, money.FieldCurrency},
		{"US", "1", 0, money.FieldCurrency},
		{"USDX", "1", 0, money.FieldCurrency},
		{"XXX", "1", 0, money.FieldCurrency},
		{"", "1", 0, money.FieldCurrency},
	}
	for _, tt := range tests {
		got, err := money.ParseDecimal(tt.currency, tt.in)
		if tt.wantField == "" {
			want := money.Amount{Currency: tt.currency, Minor: tt.want}
			if err != nil || got != want {
				t.Errorf("ParseDecimal(%q, %q) = %+v, %v; want %+v", tt.currency, tt.in, got, err, want)
			}
			continue
		}
		var fe *money.FieldError
		if !errors.As(err, &fe) || fe.Field != tt.wantField || fe.Message == "" {
			t.Errorf("ParseDecimal(%q, %q) = %+v, %v; want *FieldError on %q", tt.currency, tt.in, got, err, tt.wantField)
		}
	}
}

func TestFromMinor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		currency  string
		minor     int64
		wantField string
	}{
		{"USD", 1, ""},
		{"USD", money.MaxMinor, ""},
		{"JPY", 1000, ""},
		{"USD", 0, money.FieldAmountMinor},
		{"USD", -5, money.FieldAmountMinor},
		{"USD", money.MaxMinor + 1, money.FieldAmountMinor},
		{"usd", 100, money.FieldCurrency},
		{"ABC", 100, money.FieldCurrency},
	}
	for _, tt := range tests {
		got, err := money.FromMinor(tt.currency, tt.minor)
		if tt.wantField == "" {
			if err != nil || got != (money.Amount{Currency: tt.currency, Minor: tt.minor}) {
				t.Errorf("FromMinor(%q, %d) = %+v, %v", tt.currency, tt.minor, got, err)
			}
			continue
		}
		var fe *money.FieldError
		if !errors.As(err, &fe) || fe.Field != tt.wantField {
			t.Errorf("FromMinor(%q, %d) error = %v; want *FieldError on %q", tt.currency, tt.minor, err, tt.wantField)
		}
	}
}

func TestAmountString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		amount money.Amount
		want   string
	}{
		{money.Amount{Currency: "USD", Minor: 1230}, "12.30"},
		{money.Amount{Currency: "USD", Minor: 5}, "0.05"},
		{money.Amount{Currency: "USD", Minor: 100}, "1.00"},
		{money.Amount{Currency: "JPY", Minor: 1000}, "1000"},
		{money.Amount{Currency: "KWD", Minor: 1500}, "1.500"},
		{money.Amount{Currency: "KWD", Minor: 1}, "0.001"},
		{money.Amount{Currency: "USD", Minor: money.MaxMinor}, "90071992547409.91"},
	}
	for _, tt := range tests {
		if got := tt.amount.String(); got != tt.want {
			t.Errorf("%+v.String() = %q; want %q", tt.amount, got, tt.want)
		}
	}
}

func TestEqualForms(t *testing.T) {
	t.Parallel()
	a, err1 := money.ParseDecimal("USD", "12.3")
	b, err2 := money.ParseDecimal("USD", "12.30")
	c, err3 := money.FromMinor("USD", 1230)
	if err := errors.Join(err1, err2, err3); err != nil {
		t.Fatal(err)
	}
	if a != b || b != c {
		t.Errorf("12.3, 12.30 and 1230 minor differ: %+v %+v %+v", a, b, c)
	}
}

func TestResolve(t *testing.T) {
	t.Parallel()
	ptr := func(s string) *string { return &s }
	minor := func(n int64) *int64 { return &n }
	tests := []struct {
		name        string
		currency    string
		amount      *string
		amountMinor *int64
		want        int64
		wantField   string
	}{
		{"decimal", "USD", ptr("12.30"), nil, 1230, ""},
		{"minor", "USD", nil, minor(1230), 1230, ""},
		{"neither", "USD", nil, nil, 0, money.FieldAmount},
		{"both", "USD", ptr("12.30"), minor(1230), 0, money.FieldAmount},
		{"bad decimal", "USD", ptr("12.345"), nil, 0, money.FieldAmount},
		{"bad minor", "USD", nil, minor(0), 0, money.FieldAmountMinor},
		{"bad currency first", "usd", ptr("x"), nil, 0, money.FieldCurrency},
	}
	for _, tt := range tests {
		got, err := money.Resolve(tt.currency, tt.amount, tt.amountMinor)
		if tt.wantField == "" {
			if err != nil || got.Minor != tt.want {
				t.Errorf("%s: Resolve = %+v, %v; want %d", tt.name, got, err, tt.want)
			}
			continue
		}
		var fe *money.FieldError
		if !errors.As(err, &fe) || fe.Field != tt.wantField {
			t.Errorf("%s: Resolve error = %v; want *FieldError on %q", tt.name, err, tt.wantField)
		}
	}
}

func FuzzParseDecimal(f *testing.F) {
	seeds := []struct{ currency, s string }{
		{"USD", "12.30"}, {"USD", "12.3"}, {"USD", "12"}, {"USD", "0.5"}, {"USD", "0.01"},
		{"USD", "0"}, {"USD", "-1"}, {"USD", "+1"}, {"USD", "1e3"}, {"USD", " 1"}, {"USD", "1 "},
		{"USD", ""}, {"USD", "NaN"}, {"USD", ".5"}, {"USD", "5."}, {"USD", "12.345"},
		{"USD", "90071992547409.91"}, {"USD", "90071992547409.92"}, {"USD", "000000000000000000001"},
		{"JPY", "1000"}, {"JPY", "1.0"}, {"KWD", "1.500"}, {"KWD", "0.001"}, {"usd", "1"}, {"XXX", "1"},
	}
	for _, s := range seeds {
		f.Add(s.currency, s.s)
	}
	f.Fuzz(func(t *testing.T, currency, s string) {
		a, err := money.ParseDecimal(currency, s)
		if err != nil {
			var fe *money.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("ParseDecimal(%q, %q) error %v is not a *FieldError", currency, s, err)
			}
			return
		}
		if a.Minor <= 0 || a.Minor > money.MaxMinor {
			t.Fatalf("ParseDecimal(%q, %q).Minor = %d, outside (0, MaxMinor]", currency, s, a.Minor)
		}
		if a.Currency != currency {
			t.Fatalf("ParseDecimal(%q, %q).Currency = %q", currency, s, a.Currency)
		}
		back, err := money.ParseDecimal(currency, a.String())
		if err != nil || back != a {
			t.Fatalf("round trip of %q %q via %q = %+v, %v; want %+v", currency, s, a.String(), back, err, a)
		}
		if m, err := money.FromMinor(currency, a.Minor); err != nil || m != a {
			t.Fatalf("FromMinor(%q, %d) = %+v, %v; want %+v", currency, a.Minor, m, err, a)
		}
	})
}
