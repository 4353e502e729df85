package problem

import (
	"strings"
	"unicode/utf8"
)

// CheckText appends to errs the problem with a free-text field, if any: required and blank, not UTF-8,
// longer than maxLen characters, or holding a NUL (PostgreSQL text cannot store one).
func CheckText(errs []FieldError, field, value string, maxLen int, required bool) []FieldError {
	switch {
	case required && strings.TrimSpace(value) == "":
		return append(errs, FieldError{Field: field, Message: "is required"})
	case !utf8.ValidString(value):
		return append(errs, FieldError{Field: field, Message: "must be valid UTF-8"})
	case utf8.RuneCountInString(value) > maxLen:
		return append(errs, FieldError{Field: field, Message: "is too long"})
	case strings.ContainsRune(value, 0):
		return append(errs, FieldError{Field: field, Message: "must not contain NUL"})
	}
	return errs
}
