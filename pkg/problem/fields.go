package problem

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// CheckText appends to errs the problem with a one-line free-text field (a title, a name, a reason), if any:
// required and blank, longer than maxLen characters, or holding a character TextFault refuses. A field
// holding several lines (a description, a comment) takes CheckMultilineText instead.
func CheckText(errs []FieldError, field, value string, maxLen int, required bool) []FieldError {
	return checkText(errs, field, value, maxLen, required, false)
}

// CheckMultilineText is CheckText for fields of several lines: line feed and tab are allowed there.
func CheckMultilineText(errs []FieldError, field, value string, maxLen int, required bool) []FieldError {
	return checkText(errs, field, value, maxLen, required, true)
}

func checkText(errs []FieldError, field, value string, maxLen int, required, multiline bool) []FieldError {
	if fault := TextFault(value, multiline); fault != "" {
		return append(errs, FieldError{Field: field, Message: fault})
	}
	switch {
	case required && strings.TrimSpace(value) == "":
		return append(errs, FieldError{Field: field, Message: "is required"})
	case utf8.RuneCountInString(value) > maxLen:
		return append(errs, FieldError{Field: field, Message: tooLong(maxLen)})
	}
	return errs
}

func tooLong(maxLen int) string {
	return "is too long: at most " + strconv.Itoa(maxLen) + " characters"
}

// TextFault says why s cannot be stored as text a person may read, or "" when it can. Refused are:
//
//   - bytes that are not UTF-8 (PostgreSQL refuses them, SQLSTATE 22021);
//   - control characters: C0 (U+0000–U+001F, NUL included, which PostgreSQL text cannot hold), DEL and C1
//     (U+007F–U+009F), and the line and paragraph separators U+2028, U+2029; where multiline is true, line
//     feed (U+000A) and tab (U+0009) are allowed;
//   - bidirectional formatting characters: the embeddings and overrides U+202A–U+202E, the isolates
//     U+2066–U+2069 and the marks U+200E, U+200F, U+061C, which make a person read text in another order
//     than it is stored (an approver reading "capture 10" where "01 erutpac" is stored);
//   - zero-width and invisible characters U+200B–U+200D, U+2060 and U+FEFF, which make two strings that
//     look the same differ, or hide a word from a person while a machine still reads it.
func TextFault(s string, multiline bool) string {
	if !utf8.ValidString(s) {
		return "must be valid UTF-8"
	}
	for _, r := range s {
		switch {
		case multiline && (r == '\n' || r == '\t'):
		case r < 0x20 || (r >= 0x7f && r <= 0x9f) || r == 0x2028 || r == 0x2029:
			if multiline {
				return "must not contain control characters (line feed and tab are allowed)"
			}
			return "must not contain control characters"
		case (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) || r == 0x200e || r == 0x200f || r == 0x061c:
			return "must not contain bidirectional formatting characters (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F, U+061C)"
		case (r >= 0x200b && r <= 0x200d) || r == 0x2060 || r == 0xfeff:
			return "must not contain zero-width characters (U+200B–U+200D, U+2060, U+FEFF)"
		}
	}
	return ""
}
