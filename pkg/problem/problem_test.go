package problem_test

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retrysafe/retrysafe/pkg/problem"
)

func TestRender(t *testing.T) {
	t.Parallel()
	wrapped := fmt.Errorf("tickets: get: %w", problem.NotFound("ticket"))
	status, doc := problem.Render(wrapped)
	if status != http.StatusNotFound || doc["code"] != "not_found" || doc["detail"] != "ticket not found" || !errors.Is(wrapped, problem.ErrNotFound) {
		t.Errorf("not found: %d %v", status, doc)
	}

	status, doc = problem.Render(problem.Validation(problem.FieldError{Field: "title", Message: "is required"}).With("hint", "x"))
	if status != http.StatusUnprocessableEntity || doc["code"] != "validation_failed" || doc["hint"] != "x" || len(doc["errors"].([]problem.FieldError)) != 1 {
		t.Errorf("validation: %d %v", status, doc)
	}

	// An extension may not overwrite a standard member.
	_, doc = problem.Render(problem.New("invalid_state", "no").With("status", 200))
	if doc["status"] != http.StatusConflict {
		t.Errorf("status member overwritten: %v", doc)
	}

	// Unknown errors never show their text.
	status, doc = problem.Render(errors.New("pq: password authentication failed for user app"))
	if status != http.StatusInternalServerError || doc["code"] != "internal" || fmt.Sprint(doc["detail"]) == "pq: password authentication failed for user app" {
		t.Errorf("internal: %d %v", status, doc)
	}
}

func TestHeaders(t *testing.T) {
	t.Parallel()
	write := func(err error) http.Header {
		w := httptest.NewRecorder()
		problem.Write(w, httptest.NewRequest(http.MethodGet, "/", nil), err)
		return w.Header()
	}
	h := write(&problem.Error{Code: "request_in_progress", RetryAfter: 2})
	if h.Get("Content-Type") != "application/problem+json" || h.Get("Cache-Control") != "no-store" || h.Get("Retry-After") != "2" {
		t.Errorf("headers = %v", h)
	}
	if h := write(problem.ErrStoreUnavailable); h.Get("Retry-After") == "" {
		t.Errorf("store unavailable without Retry-After: %v", h)
	}
}

func TestStoreErrors(t *testing.T) {
	t.Parallel()
	if !problem.IsStoreUnavailable(&pgconn.PgError{Code: "57P01"}) || !problem.IsStoreUnavailable(&pgconn.PgError{Code: "08006"}) {
		t.Error("connection failures are not store_unavailable")
	}
	if problem.IsStoreUnavailable(&pgconn.PgError{Code: "23505"}) || problem.IsStoreUnavailable(errors.New("x")) {
		t.Error("a refused query is store_unavailable")
	}
}

// TestEveryCodeIsInTheTable reads the module's Go files for the codes they name (problem.New("x", ...),
// Code: "x", problem.Code("x")) and asks Render for each: a code missing from the table would answer 500.
func TestEveryCodeIsInTheTable(t *testing.T) {
	t.Parallel()
	named := regexp.MustCompile(`(?:problem\.New\(|problem\.Error\{Code: |problem\.Code\(|\.Code [!=]= )"([a-z_]+)"`)
	seen := 0
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range named.FindAllSubmatch(src, -1) {
			seen++
			code := problem.Code(m[1])
			if status, _ := problem.Render(&problem.Error{Code: code}); status == http.StatusInternalServerError && code != "internal" {
				t.Errorf("%s names code %q, which is not in problem's table", path, code)
			}
		}
		return nil
	})
	if err != nil || seen < 50 {
		t.Fatalf("walked the module: %v, %d codes named; want no error and the code base's codes", err, seen)
	}
}

func TestTextFault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in        string
		multiline bool
		ok        bool
	}{
		{"plain text, ünïcödé, 日本語, emoji 🙂", false, true},
		{"two\nlines\tand a tab", true, true},
		{"two\nlines", false, false},
		{"tab\there", false, false},
		{"carriage\rreturn", true, false},
		{"nul\x00", true, false},
		{"\xff\xfe", true, false},
		{"del\x7f", true, false},
		{"c1\u0085", true, false},
		{"line\u2028sep", true, false},
		{"rlo\u202e01 erutpac", true, false},
		{"isolate\u2066x\u2069", true, false},
		{"mark\u200f", true, false},
		{"arabic mark\u061c", true, false},
		{"zero\u200bwidth", true, false},
		{"joiner\u200d", true, false},
		{"word\u2060joiner", true, false},
		{"\ufeffbom", true, false},
		// Invisible to a person, read by a model: every default-ignorable character and the noncharacters.
		{"ar\u0600abic number sign, visible", false, true},
		{"tag\U000E0041\U000E0042 letters", false, false},
		{"cancel tag\U000E007F", false, false},
		{"language tag\U000E0001", false, false},
		{"soft\u00adhyphen", false, false},
		{"hangul\u3164filler", false, false},
		{"choseong\u115ffiller", false, false},
		{"halfwidth\uffa0filler", false, false},
		{"variation\ufe0fselector", false, false},
		{"ideographic variation\U000E0100", false, false},
		{"mongolian\u180eseparator", false, false},
		{"grapheme\u034fjoiner", false, false},
		{"invisible\u2062times", false, false},
		{"interlinear\ufff9annotation", false, false},
		{"nonchar\ufffe", false, false},
		{"nonchar\uffff", false, false},
		{"nonchar\ufdd0", false, false},
		{"nonchar\U0010FFFF", false, false},
	} {
		fault := problem.TextFault(tc.in, tc.multiline)
		if (fault == "") != tc.ok {
			t.Errorf("TextFault(%q, multiline %v) = %q, want ok %v", tc.in, tc.multiline, fault, tc.ok)
		}
	}
	errs := problem.CheckText(nil, "title", "a\u202eb", 10, true)
	if len(errs) != 1 || errs[0].Field != "title" {
		t.Errorf("CheckText = %v, want one error naming title", errs)
	}
	if errs := problem.CheckText(nil, "title", "abcdef", 5, true); len(errs) != 1 || errs[0].Message != "is too long: at most 5 characters" {
		t.Errorf("CheckText too long = %v", errs)
	}
}

// FuzzTextFault checks that text TextFault accepts is what PostgreSQL text stores and a person reads as it is:
// UTF-8, without NUL or the characters it lists.
func FuzzTextFault(f *testing.F) {
	for _, s := range []string{"", "ok", "a\x00b", "\xff\xfe", "\u202e", "\u200b", "a\nb", "\xed\xa0\x80", "\xc0\xaf", strings.Repeat("é", 300),
		"\U000E0041", "\u00ad", "\u3164", "\ufe0f", "\ufffe", "\u0600"} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, s string, multiline bool) {
		if problem.TextFault(s, multiline) != "" {
			return
		}
		if !utf8.ValidString(s) || strings.ContainsAny(s, "\x00\r\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200b\u200c\u200d\u2060\ufeff") {
			t.Fatalf("TextFault accepted %q", s)
		}
		for _, r := range s {
			if (unicode.Is(unicode.Cf, r) && !unicode.Is(unicode.Prepended_Concatenation_Mark, r)) || unicode.Is(unicode.Variation_Selector, r) ||
				unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r) || unicode.Is(unicode.Noncharacter_Code_Point, r) {
				t.Fatalf("TextFault accepted %q with %U", s, r)
			}
		}
		if !multiline && strings.ContainsAny(s, "\n\t") {
			t.Fatalf("TextFault accepted %q on one line", s)
		}
	})
}

func TestUnstorableText(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("tickets: get: %w", &pgconn.PgError{Code: "22021"})
	w := httptest.NewRecorder()
	problem.Write(w, httptest.NewRequest(http.MethodPost, "/v1/tickets", nil), err)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `"code":"invalid_request"`) || problem.IsStoreUnavailable(err) {
		t.Errorf("22021 answered %d %s; want 400 invalid_request", w.Code, w.Body)
	}
}
