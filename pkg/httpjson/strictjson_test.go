package httpjson_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/retrysafe/retrysafe/pkg/httpjson"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

type reference struct {
	Artifact string `json:"artifact,omitempty"`
}

type line struct {
	SKU   string `json:"sku"`
	Count int    `json:"count"`
}

type order struct {
	Amount string `json:"amount"`
	reference
	Lines    []line            `json:"lines"`
	Shipping *line             `json:"shipping"`
	Labels   map[string]string `json:"labels"`
	Raw      json.RawMessage   `json:"raw"`
	Any      any               `json:"any"`
}

func TestDecodeJSONBytesStrictNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body  string
		field string // "" when accepted
	}{
		{`{"amount":"1.00","artifact":"a","lines":[{"sku":"x","count":1}],"shipping":{"sku":"y"},"labels":{"A":"1","a":"2"},"raw":{"x":1},"any":{"y":2}}`, ""},
		{`{"amount":"1.00","amount":"9999.00"}`, "amount"},
		{`{"AMOUNT":"7.00"}`, "AMOUNT"},
		{`{"Amount":"7.00","amount":"1.00"}`, "Amount"},
		{`{"Artifact":"a"}`, "Artifact"},
		{`{"lines":[{"sku":"x"},{"sku":"x","SKU":"y"}]}`, "lines[1].SKU"},
		{`{"lines":[{"count":1,"count":2}]}`, "lines[0].count"},
		{`{"shipping":{"Sku":"y"}}`, "shipping.Sku"},
		{`{"labels":{"a":"1","a":"2"}}`, "labels.a"},
		{`{"raw":{"x":1,"x":2}}`, "raw.x"},
		{`{"raw":{"deep":[{"k":1,"k":1}]}}`, "raw.deep[0].k"},
		{`{"any":{"y":1,"y":1}}`, "any.y"},
		// encoding/json matches names as bytes.EqualFold does: ſ (U+017F) folds to s, K (U+212A) to k.
		{`{"amount":"1","amount":"2"}`, "amount"},
		{`{"amount":"1.00","lines":[],"lineſ":[{"sku":"x"}]}`, "lineſ"},
		{`{"ſhipping":{"sku":"y"},"shipping":{"sku":"x"}}`, "ſhipping"},
		{`{"lines":[{"sku":"x","sKu":"y"}]}`, "lines[0].sKu"},
		{"{\"lines\":[{\"s\u212au\":\"x\"}]}", "lines[0].sKu"},
	} {
		var o order
		err := httpjson.DecodeBytes([]byte(tc.body), &o)
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.body, err)
			}
			continue
		}
		var pe *problem.Error
		if !errors.As(err, &pe) || pe.Code != "invalid_request" || len(pe.Fields) != 1 || pe.Fields[0].Field != tc.field {
			t.Errorf("%s: got %v, want invalid_request naming %q", tc.body, err, tc.field)
		}
	}
	var o order
	if err := httpjson.DecodeBytes([]byte("{\"amount\":\"\xff\"}"), &o); err == nil {
		t.Error("invalid UTF-8 accepted")
	}
}

// TestDecodeJSONBytesLoneSurrogates: a \u escape of one half of a UTF-16 surrogate pair names no character;
// encoding/json would store U+FFFD for it, so "\ud800" and "\udbff" would be one value. It is 400
// invalid_request naming the member, in a value or a name, at any depth; a whole pair is a character and passes.
func TestDecodeJSONBytesLoneSurrogates(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body  string
		field string // "" when accepted
	}{
		{`{"amount":"\ud83d\ude00","lines":[{"sku":"\u00e9\uD83D\uDE00"}]}`, ""},
		{`{"amount":"\\ud800"}`, ""}, // an escaped backslash, then text
		{`{"amount":"\ud800"}`, "amount"},
		{`{"amount":"x\udfffy"}`, "amount"},
		{`{"amount":"\ud800\u0041"}`, "amount"},
		{`{"amount":"\ude00\ud83d"}`, "amount"},
		{`{"lines":[{"sku":"a"},{"sku":"\uDBFF"}]}`, "lines[1].sku"},
		{`{"labels":{"\ud800":"x"}}`, "labels"},
		{`{"raw":{"deep":["\ud800"]}}`, "raw.deep[0]"},
	} {
		var o order
		err := httpjson.DecodeBytes([]byte(tc.body), &o)
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.body, err)
			}
			continue
		}
		var pe *problem.Error
		if !errors.As(err, &pe) || pe.Code != "invalid_request" || len(pe.Fields) != 1 || pe.Fields[0].Field != tc.field {
			t.Errorf("%s: got %v (%+v), want invalid_request naming %q", tc.body, err, pe, tc.field)
		}
	}
}

// FuzzDecodeJSONBytes: a body DecodeJSONBytes accepts is UTF-8, names each member of its top-level object once,
// exactly as a field is named, and decodes to the same value however it is read.
func FuzzDecodeJSONBytes(f *testing.F) {
	for _, s := range []string{`{"amount":"1"}`, `{"amount":"1","amount":"2"}`, `{"AMOUNT":"1"}`, `{"lines":[{"sku":"a","sku":"b"}]}`,
		`{"raw":{"a":1,"a":2}}`, "{\"amount\":\"\x00\"}", "{\"amount\":\"\xff\"}", `{"amount":"1"} {}`, `[]`, `{"amount":1}`,
		`{"any":` + nestedArrays(100_000) + `}`, `{"any":` + nestedArrays(63) + `}`, `{"\u017fhipping":{}}`, `{"lines":[{"s\u212au":"x"}]}`,
		`{"amount":"\ud800"}`, `{"amount":"\ud83d\ude00"}`, `{"lines":[{"count":1e23}]}`, `{"lines":[{"count":1` + strings.Repeat("0", 399) + `}]}`} {
		f.Add([]byte(s))
	}
	fields := map[string]bool{"amount": true, "artifact": true, "lines": true, "shipping": true, "labels": true, "raw": true, "any": true}
	f.Fuzz(func(t *testing.T, body []byte) {
		var o order
		if err := httpjson.DecodeBytes(body, &o); err != nil {
			var pe *problem.Error
			inexact := errors.As(err, &pe) && pe.Code == "validation_failed" && len(pe.Fields) == 1
			if !errors.As(err, &pe) || (pe.Code.Status() != 400 && !inexact) {
				t.Fatalf("refusal %v is neither a 400 problem nor a 422 naming an inexact number", err)
			}
			return
		}
		if n := inexactNumber(body); n != "" {
			t.Fatalf("accepted %q with the inexact number %s", body, n)
		}
		if !utf8.Valid(body) {
			t.Fatalf("accepted invalid UTF-8 %q", body)
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			return // null decodes into a struct without members
		}
		seen := map[string]bool{}
		for dec.More() {
			tok, _ := dec.Token()
			name := tok.(string)
			if seen[name] || !fields[name] {
				t.Fatalf("accepted %q with member %q", body, name)
			}
			seen[name] = true
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				t.Fatal(err)
			}
		}
	})
}
