package auditchain_test

import (
	"encoding/json"
	"math"
	"math/big"
	"strconv"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
)

func TestExactNumber(t *testing.T) {
	t.Parallel()
	for text, exact := range map[string]bool{
		"0": true, "-0": true, "0.0": true, "0e999999999999": true, "1": true, "-1": true, "2.50": true, "0.1": true, "1e3": true,
		"1E+3": true, "100e-2": true, "10000000000000000": true, "100000000000000000": true, "1e17": true, "1e21": true,
		"9007199254740992": true, "-9007199254740992": true, "9007199254740994": true, "0.30000000000000004": true,
		"1.7976931348623157e308": true, "5e-324": true, "1e-7": true, "123456789012345678901234567890": false,
		"9007199254740993": false, "-9007199254740993": false, "9223372036854775807": false, "0.30000000000000001": false,
		"1e400": false, "-1e400": false, "1e-400": false, "2e-324": false, "1.00000000000000000000001": false,
		"": false, "-": false, "01": false, "+1": false, "1.": false, ".5": false, "1e": false, "1e+": false, "1e+-3": false,
		"0x10": false, "Inf": false, "NaN": false, "1_000": false, "1e99999999999999999999": false,
	} {
		if got := auditchain.ExactNumber(text); got != exact {
			t.Errorf("ExactNumber(%q) = %v, want %v", text, got, exact)
		}
	}
}

// FuzzExactNumber: a number ExactNumber accepts is written by Canonical as text of the same value, which is
// exact again; a number it refuses is one Canonical would change (or cannot write). Go's own formatting of any
// double is always exact.
func FuzzExactNumber(f *testing.F) {
	for _, s := range []string{"0", "1e17", "9007199254740993", "0.1", "2.50", "1e400", "-0.0000001", "123.456e-5"} {
		f.Add(s, 0.0)
	}
	f.Add("1", math.MaxFloat64)
	f.Add("1", math.SmallestNonzeroFloat64)
	f.Add("1", 1e21)
	f.Fuzz(func(t *testing.T, text string, x float64) {
		if !math.IsInf(x, 0) && !math.IsNaN(x) {
			for _, format := range []byte{'g', 'e', 'f'} {
				if s := strconv.FormatFloat(x, format, -1, 64); !auditchain.ExactNumber(s) {
					t.Fatalf("ExactNumber(%s) = false for the text of a double", s)
				}
			}
		}
		if !json.Valid([]byte(text)) {
			return
		}
		var n json.Number
		if err := json.Unmarshal([]byte(text), &n); err != nil {
			return // JSON, but not a number
		}
		if string(n) != text {
			return // a number with whitespace around it: not a number's text
		}
		exact := auditchain.ExactNumber(text)
		canon, err := auditchain.Canonical(json.RawMessage(text))
		if err != nil {
			if exact {
				t.Fatalf("exact %s: Canonical: %v", text, err)
			}
			return
		}
		if exact && !auditchain.ExactNumber(string(canon)) {
			t.Fatalf("exact %s is written %s, which is not exact", text, canon)
		}
		if same, ok := sameValue(string(n), string(canon)); ok && same != exact {
			t.Fatalf("ExactNumber(%s) = %v, but Canonical writes %s", text, exact, canon)
		}
	})
}

// sameValue compares two numbers' exact values; ok is false when an exponent is too large to compare them
// cheaply.
func sameValue(a, b string) (same, ok bool) {
	for _, s := range []string{a, b} {
		if i := strings.IndexAny(s, "eE"); i >= 0 && len(strings.TrimLeft(s[i+1:], "+-0")) > 3 {
			return false, false
		}
	}
	x, okx := new(big.Rat).SetString(a)
	y, oky := new(big.Rat).SetString(b)
	return okx && oky && x.Cmp(y) == 0, okx && oky
}
