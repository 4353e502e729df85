package httpjson_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/httpjson"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// TestDecodeJSONBytesExactNumbers: a number that RFC 8785 would write as another number (beyond 2^53, more
// digits than a double holds, out of a double's range) is refused at any depth, 422 validation_failed naming
// the member; the numbers it keeps exactly pass, large or small.
func TestDecodeJSONBytesExactNumbers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body  string
		field string // "" when accepted
	}{
		{`{"lines":[{"count":9007199254740992}],"raw":{"x":100000000000000000,"y":0.1,"z":-2.50,"w":1e21},"any":[1e-7]}`, ""},
		{`{"lines":[{"count":1},{"count":9007199254740993}]}`, "lines[1].count"},
		{`{"raw":{"n":[1,2,9223372036854775807]}}`, "raw.n[2]"},
		{`{"raw":{"deep":{"ratio":0.30000000000000001}}}`, "raw.deep.ratio"},
		{`{"any":1e400}`, "any"},
		{`{"shipping":{"count":-9007199254740993}}`, "shipping.count"},
		// A number an integer field cannot hold is the same answer, however it is written.
		{`{"lines":[{"count":1e23}]}`, "lines[0].count"},
		{`{"lines":[{"count":-1e19}]}`, "lines[0].count"},
		{`{"shipping":{"count":10000000000000000000}}`, "shipping.count"},
		{`{"shipping":{"count":1` + strings.Repeat("0", 299) + `}}`, "shipping.count"},
		{`{"shipping":{"count":1` + strings.Repeat("0", 399) + `}}`, "shipping.count"},
		{`{"shipping":{"count":` + strings.Repeat("7", 400) + `}}`, "shipping.count"},
		{`{"any":1e23,"raw":[1e21],"shipping":{"count":-9007199254740992}}`, ""},
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
		if !errors.As(err, &pe) || pe.Code != "validation_failed" || pe.Code.Status() != 422 || len(pe.Fields) != 1 ||
			pe.Fields[0].Field != tc.field {
			t.Errorf("%s: got %v, want validation_failed naming %q", tc.body, err, tc.field)
		}
	}
	// A fraction is not an integer at all: the wrong type, 400 as a string for a number is.
	var o order
	if err := httpjson.DecodeBytes([]byte(`{"lines":[{"count":12.5}]}`), &o); !errors.As(err, new(*problem.Error)) ||
		err.(*problem.Error).Code != "invalid_request" {
		t.Errorf("12.5 for an int: %v, want invalid_request", err)
	}
}

// inexactNumber returns the first number in body that auditchain.ExactNumber refuses, or "".
func inexactNumber(body []byte) string {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		if n, ok := tok.(json.Number); ok && !auditchain.ExactNumber(n.String()) {
			return n.String()
		}
	}
}
