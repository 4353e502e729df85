// Package money turns the amounts callers send into exact integer minor units
// (cents, yen, fils) and back, so a service never stores or compares a float.
//
// A command may carry the amount either as a decimal string ("12.30") or in
// minor units (1230); both resolve to the same Amount, which is what a request
// fingerprint and a stored row should hold:
//
//	a, err := money.Resolve(cmd.Currency, cmd.Amount, cmd.AmountMinor)
//	var fe *money.FieldError
//	if errors.As(err, &fe) {
//		// 422 validation_failed with errors: [{field: fe.Field, message: fe.Message}]
//	}
//	// a == money.Amount{Currency: "USD", Minor: 1230}; a.String() == "12.30"
//
// The exponent of each currency comes from a pinned ISO 4217 table; a currency
// missing from it is refused rather than guessed. Amounts are positive and at
// most MaxMinor minor units, so they survive a round trip through a JSON
// number read as float64 by any client.
package money

import (
	"fmt"
	"strconv"

	"github.com/shopspring/decimal"
)

// MaxMinor is the largest amount accepted, in minor units: 2^53-1, the largest
// integer every JSON implementation represents exactly.
const MaxMinor = 1<<53 - 1

// JSON field names reported in FieldError.Field.
const (
	FieldAmount      = "amount"
	FieldAmountMinor = "amount_minor"
	FieldCurrency    = "currency"
)

// MaxDecimalLen bounds the decimal strings ParseDecimal reads (longer is a validation failure). The longest
// accepted amount (MaxMinor with three decimals) has 17 characters; the slack
// allows leading zeros without letting a caller hand over a megabyte of digits.
const MaxDecimalLen = 64

// exponents is the ISO 4217 minor-unit exponent of every supported currency.
// It is pinned on purpose: adding a currency is a reviewed change, not a lookup.
var exponents = map[string]int{
	// No minor unit in use.
	"BIF": 0, "CLP": 0, "DJF": 0, "GNF": 0, "ISK": 0, "JPY": 0, "KMF": 0, "KRW": 0,
	"PYG": 0, "RWF": 0, "UGX": 0, "VND": 0, "VUV": 0, "XAF": 0, "XOF": 0, "XPF": 0,

	// Three decimals.
	"BHD": 3, "IQD": 3, "JOD": 3, "KWD": 3, "LYD": 3, "OMR": 3, "TND": 3,

	// Two decimals.
	"AED": 2, "ARS": 2, "AUD": 2, "BGN": 2, "BRL": 2, "CAD": 2, "CHF": 2, "CNY": 2,
	"COP": 2, "CZK": 2, "DKK": 2, "EGP": 2, "EUR": 2, "GBP": 2, "HKD": 2, "HUF": 2,
	"IDR": 2, "ILS": 2, "INR": 2, "KES": 2, "MAD": 2, "MXN": 2, "MYR": 2, "NGN": 2,
	"NOK": 2, "NZD": 2, "PEN": 2, "PHP": 2, "PKR": 2, "PLN": 2, "QAR": 2, "RON": 2,
	"RSD": 2, "RUB": 2, "SAR": 2, "SEK": 2, "SGD": 2, "THB": 2, "TRY": 2, "TWD": 2,
	"UAH": 2, "USD": 2, "ZAR": 2,
}

// Amount is a positive amount of money in the currency's minor unit.
// Two Amounts are equal (==) exactly when they are the same amount.
type Amount struct {
	Currency string // ISO 4217 code, uppercase
	Minor    int64  // in (0, MaxMinor]
}

// String formats the amount with exactly the currency's number of decimals:
// "12.30" USD, "1000" JPY, "1.500" KWD. It does not include the currency.
func (a Amount) String() string {
	exp, ok := Exponent(a.Currency)
	if !ok {
		// Not produced by this package; show the raw minor units rather than guess.
		return strconv.FormatInt(a.Minor, 10)
	}
	return decimal.New(a.Minor, -int32(exp)).StringFixed(int32(exp))
}

// FieldError is a well-formed request value that is not acceptable, named by
// its JSON field so a handler can answer 422 validation_failed with
// errors: [{field, message}].
type FieldError struct {
	Field   string // FieldAmount, FieldAmountMinor or FieldCurrency
	Message string // for the caller; says what is accepted
}

func (e *FieldError) Error() string {
	return e.Field + ": " + e.Message
}

// Exponent reports the number of decimals of currency, an uppercase ISO 4217
// code, and whether the currency is supported.
func Exponent(currency string) (int, bool) {
	exp, ok := exponents[currency]
	return exp, ok
}

// ParseDecimal reads s, a plain decimal string such as "12.30", "12" or
// "0.5", as an amount of currency.
//
// It returns a *FieldError (field "currency") for a currency that is not an
// uppercase three-letter supported code, and a *FieldError (field "amount")
// for anything but digits with an optional fraction: signs, exponents,
// spaces, "NaN", more fraction digits than the currency has (even zeros:
// "12.300" USD is refused), zero, or more than MaxMinor minor units.
func ParseDecimal(currency, s string) (Amount, error) {
	exp, err := currencyExponent(currency)
	if err != nil {
		return Amount{}, err
	}
	if err := checkPlainDecimal(currency, s, exp); err != nil {
		return Amount{}, err
	}
	d, err := decimal.NewFromString(s)
	if err != nil {
		// checkPlainDecimal only lets through what decimal parses.
		return Amount{}, amountError(FieldAmount, "must be a decimal number such as \"12.30\"")
	}
	// Exact: s has at most exp fraction digits.
	minor := d.Shift(int32(exp))
	if minor.Sign() <= 0 {
		return Amount{}, amountError(FieldAmount, "must be greater than zero")
	}
	if minor.GreaterThan(decimal.NewFromInt(MaxMinor)) {
		return Amount{}, amountError(FieldAmount, tooLarge(currency, exp))
	}
	return Amount{Currency: currency, Minor: minor.IntPart()}, nil
}

// FromMinor returns minor units of currency as an Amount.
//
// It returns a *FieldError (field "currency") for an unsupported currency and
// a *FieldError (field "amount_minor") when minor is not in (0, MaxMinor].
func FromMinor(currency string, minor int64) (Amount, error) {
	exp, err := currencyExponent(currency)
	if err != nil {
		return Amount{}, err
	}
	if minor <= 0 {
		return Amount{}, amountError(FieldAmountMinor, "must be greater than zero")
	}
	if minor > MaxMinor {
		return Amount{}, amountError(FieldAmountMinor, tooLarge(currency, exp))
	}
	return Amount{Currency: currency, Minor: minor}, nil
}

// Resolve builds the Amount of a command that accepts either a decimal string
// (JSON field "amount") or minor units ("amount_minor"). Exactly one of the
// two must be non-nil; otherwise the *FieldError names "amount".
// The currency is checked first, so a bad currency is reported as such.
func Resolve(currency string, amount *string, amountMinor *int64) (Amount, error) {
	if _, err := currencyExponent(currency); err != nil {
		return Amount{}, err
	}
	switch {
	case amount != nil && amountMinor != nil:
		return Amount{}, amountError(FieldAmount, "give either amount or amount_minor, not both")
	case amount != nil:
		return ParseDecimal(currency, *amount)
	case amountMinor != nil:
		return FromMinor(currency, *amountMinor)
	default:
		return Amount{}, amountError(FieldAmount, "one of amount or amount_minor is required")
	}
}

func currencyExponent(currency string) (int, error) {
	if !isCurrencyCode(currency) {
		return 0, &FieldError{Field: FieldCurrency, Message: "must be a three-letter uppercase ISO 4217 code such as \"USD\""}
	}
	exp, ok := Exponent(currency)
	if !ok {
		return 0, &FieldError{Field: FieldCurrency, Message: fmt.Sprintf("currency %s is not supported", currency)}
	}
	return exp, nil
}

func isCurrencyCode(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := range len(s) {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}

// checkPlainDecimal accepts digits with an optional '.' and one or more
// fraction digits, at most exp of them. decimal.NewFromString alone would also
// take signs, exponents and more, which a money field must not.
func checkPlainDecimal(currency, s string, exp int) error {
	const syntax = "must be a plain decimal number such as \"12.30\" (digits and an optional fraction, no sign or exponent)"
	if s == "" {
		return amountError(FieldAmount, "must not be empty")
	}
	if len(s) > MaxDecimalLen {
		return amountError(FieldAmount, fmt.Sprintf("must be at most %d characters", MaxDecimalLen))
	}
	fracDigits, ok := plainDecimalFraction(s)
	if !ok {
		return amountError(FieldAmount, syntax)
	}
	if fracDigits > exp {
		if exp == 0 {
			return amountError(FieldAmount, fmt.Sprintf("%s has no decimals", currency))
		}
		return amountError(FieldAmount, fmt.Sprintf("%s has at most %d decimals", currency, exp))
	}
	return nil
}

// plainDecimalFraction reports whether s is one or more digits with an optional '.' and one or more fraction
// digits, and how many fraction digits it has.
func plainDecimalFraction(s string) (fracDigits int, ok bool) {
	intDigits, seenDot := 0, false
	for i := range len(s) {
		switch c := s[i]; {
		case c >= '0' && c <= '9' && seenDot:
			fracDigits++
		case c >= '0' && c <= '9':
			intDigits++
		case c == '.' && !seenDot:
			seenDot = true
		default:
			return 0, false
		}
	}
	return fracDigits, intDigits > 0 && (!seenDot || fracDigits > 0)
}

func tooLarge(currency string, exp int) string {
	return fmt.Sprintf("must be at most %s %s", decimal.New(MaxMinor, -int32(exp)).StringFixed(int32(exp)), currency)
}

func amountError(field, msg string) error {
	return &FieldError{Field: field, Message: msg}
}
