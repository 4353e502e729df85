package auditchain

import (
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
)

// ExactNumber reports whether text, a JSON number, keeps its value through RFC 8785: whether the number that
// Canonical writes for it (the shortest text of the IEEE 754 double nearest to it) denotes the same decimal
// value. 1e17, 0.1 and 2.50 do (100000000000000000, 0.1, 2.5); 9007199254740993 (2^53+1), the int64 maximum,
// 0.30000000000000001 and 1e400 do not: a record or an approval would show another number than the one sent.
// Text that is not a JSON number is not exact.
func ExactNumber(text string) bool {
	want, ok := parseDecimal(text)
	if !ok {
		return false
	}
	canon := jsontext.Value(text)
	if err := canon.Canonicalize(); err != nil {
		return false // out of a double's range
	}
	got, ok := parseDecimal(string(canon))
	return ok && got == want
}

// decimal is a number's exact value: (-1 if neg) × 0.digits × 10^exp, digits without leading or trailing zeros;
// zero is the zero decimal.
type decimal struct {
	neg    bool
	digits string
	exp    int
}

// maxExponent bounds the exponents parseDecimal takes; no double comes near, and the arithmetic stays far
// from overflow.
const maxExponent = 1 << 20

// parseDecimal reads a number in JSON's grammar (RFC 8259 section 6) or in RFC 8785's output, which is a subset
// of it with "e+" exponents.
func parseDecimal(s string) (decimal, bool) {
	var d decimal
	if rest, ok := strings.CutPrefix(s, "-"); ok {
		d.neg, s = true, rest
	}
	mantissa, exponent, hasExp := strings.Cut(s, "e")
	if !hasExp {
		mantissa, exponent, hasExp = strings.Cut(s, "E")
	}
	whole, frac, hasFrac := strings.Cut(mantissa, ".")
	if !validMantissa(whole, frac, hasFrac) {
		return decimal{}, false
	}
	e := 0
	if hasExp {
		var ok bool
		if e, ok = parseExponent(exponent); !ok {
			return decimal{}, false
		}
	}
	all := whole + frac
	lead := len(all) - len(strings.TrimLeft(all, "0"))
	d.digits = strings.TrimRight(all[lead:], "0")
	if d.digits == "" {
		return decimal{}, true // zero, whatever its sign and exponent
	}
	if e > maxExponent || e < -maxExponent {
		return decimal{}, false
	}
	d.exp = len(whole) - lead + e
	return d, true
}

// validMantissa reports whether whole and frac, the digits before and after the point (hasFrac: there is a
// point), are JSON's: whole digits without a leading zero, and at least one digit after a point.
func validMantissa(whole, frac string, hasFrac bool) bool {
	if whole == "" || !allDigits(whole) || (len(whole) > 1 && whole[0] == '0') {
		return false
	}
	return !hasFrac || (frac != "" && allDigits(frac))
}

// parseExponent reads the digits after the "e", optionally signed; one of more than seven significant digits
// reads as beyond maxExponent.
func parseExponent(text string) (int, bool) {
	sign := 1
	if rest, ok := strings.CutPrefix(text, "-"); ok {
		sign, text = -1, rest
	} else {
		text = strings.TrimPrefix(text, "+")
	}
	if text == "" || !allDigits(text) {
		return 0, false
	}
	digits := strings.TrimLeft(text, "0")
	if len(digits) > 7 {
		return sign * (maxExponent + 1), true
	}
	e, _ := strconv.Atoi("0" + digits)
	return sign * e, true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
