package problem

import (
	"strconv"
	"strings"
	"unicode"
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
//   - invisible characters, which a person does not see and a machine (a model reading a ticket) still reads,
//     or which make two strings that look the same differ: every format character (general category Cf:
//     zero-width U+200B–U+200D, U+2060, U+FEFF, the soft hyphen U+00AD, the tags U+E0001 and
//     U+E0020–U+E007F, U+180E, ...) but the prepended concatenation marks, which are visible signs (U+0600
//     ARABIC NUMBER SIGN); the variation selectors (U+FE00–U+FE0F, U+E0100–U+E01EF, U+180B–U+180F); and the
//     other default-ignorable code points (the Hangul fillers U+115F, U+1160, U+3164, U+FFA0, U+034F, the
//     unassigned tag block U+E0000–U+E0FFF): together Unicode's Default_Ignorable_Code_Point, as Go's unicode
//     tables give it;
//   - noncharacters (U+FDD0–U+FDEF and the last two code points of every plane, U+FFFE and U+FFFF among
//     them), which Unicode reserves for a program's own use and never for text that is exchanged.
//
// They are refused, never stripped: what is stored and shown is what was sent.
func TextFault(s string, multiline bool) string {
	if !utf8.ValidString(s) {
		return "must be valid UTF-8"
	}
	for _, r := range s {
		if fault := runeFault(r, multiline); fault != "" {
			return fault
		}
	}
	return ""
}

// runeFault is TextFault for one character.
func runeFault(r rune, multiline bool) string {
	switch {
	case multiline && (r == '\n' || r == '\t'):
	case control(r):
		if multiline {
			return "must not contain control characters (line feed and tab are allowed)"
		}
		return "must not contain control characters"
	case r < 0xa0:
	case bidirectional(r):
		return "must not contain bidirectional formatting characters (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F, U+061C)"
	case invisible(r):
		return "must not contain invisible characters (zero-width and other format characters such as U+200B, U+00AD and the tags U+E0000–U+E007F, variation selectors, Hangul fillers)"
	case unicode.Is(unicode.Noncharacter_Code_Point, r):
		return "must not contain noncharacters (U+FFFE, U+FFFF, U+FDD0–U+FDEF and the last two code points of every plane)"
	}
	return ""
}

// control reports whether r is a C0 or C1 control, DEL, or the line or paragraph separator.
func control(r rune) bool {
	return r < 0x20 || (r >= 0x7f && r <= 0x9f) || r == 0x2028 || r == 0x2029
}

// bidirectional reports whether r is a bidirectional embedding, override, isolate or mark.
func bidirectional(r rune) bool {
	return (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) || r == 0x200e || r == 0x200f || r == 0x061c
}

// invisible reports whether r is default-ignorable: Unicode's derivation of Default_Ignorable_Code_Point
// (DerivedCoreProperties.txt), with the format characters it leaves out (U+FFF9–U+FFFB, U+13430–U+1343F, which
// hide or arrange text too) kept in.
func invisible(r rune) bool {
	switch {
	case unicode.Is(unicode.Cf, r):
		return !unicode.Is(unicode.Prepended_Concatenation_Mark, r)
	case unicode.Is(unicode.Variation_Selector, r), unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r):
		return true
	}
	return false
}
