package jsondepth_test

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/retrysafe/retrysafe/pkg/jsondepth"
)

func nested(depth int) string {
	return strings.Repeat("[", depth) + strings.Repeat("]", depth)
}

// TestCheck: a text of Max levels passes, one level more is refused wherever it is; brackets inside strings,
// escaped quotes included, do not count, and closers in excess buy no opener.
func TestCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		text string
		deep bool
	}{
		{nested(jsondepth.Max), false},
		{`{"a":` + nested(jsondepth.Max-1) + `}`, false},
		{nested(jsondepth.Max + 1), true},
		{`{"a":` + nested(jsondepth.Max) + `}`, true},
		{`[` + strings.Repeat(nested(jsondepth.Max-1)+",", 100) + `1]`, false},
		{`{"a":"` + strings.Repeat("[", 1000) + `"}`, false},
		{`{"a":"\"` + strings.Repeat("{", 1000) + `\\"}`, false},
		{`{"a":"\\"` + nested(jsondepth.Max) + `}`, true},
		{strings.Repeat("]", 1000) + nested(jsondepth.Max+1), true},
		{nested(100_000), true},
	} {
		err := jsondepth.Check([]byte(tc.text))
		if tc.deep != errors.Is(err, jsondepth.ErrTooDeep) || (!tc.deep && err != nil) {
			t.Errorf("%.80s: %v, want deep %v", tc.text, err, tc.deep)
		}
		if !tc.deep && json.Valid([]byte(tc.text)) {
			var v any
			if err := json.Unmarshal([]byte(tc.text), &v); err != nil {
				t.Errorf("%.80s: %v", tc.text, err)
			}
		}
	}
}

// TestCheckCostsNothingPastTheLimit: refusing 100,000 levels allocates what refusing 65 does, a few words for
// the error, and an accepted text allocates nothing.
func TestCheckCostsNothingPastTheLimit(t *testing.T) {
	shallow, deep := []byte(nested(jsondepth.Max)), []byte(nested(100_000))
	if n := testing.AllocsPerRun(10, func() { _ = jsondepth.Check(shallow) }); n != 0 {
		t.Errorf("accepted text: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(10, func() { _ = jsondepth.Check(deep) }); n > 5 {
		t.Errorf("refused text: %v allocations, want at most 5", n)
	}
}

// TestReader: the stream stops with ErrTooDeep at the byte that opens level Max+1, however it is cut, and a
// text within the limit reads whole.
func TestReader(t *testing.T) {
	t.Parallel()
	deep := `{"a":"[[[",` + `"b":` + nested(jsondepth.Max+10) + `}`
	for _, r := range []io.Reader{strings.NewReader(deep), iotest.OneByteReader(strings.NewReader(deep)), iotest.HalfReader(strings.NewReader(deep))} {
		got, err := io.ReadAll(jsondepth.Reader(r))
		if !errors.Is(err, jsondepth.ErrTooDeep) || string(got) != deep[:strings.Index(deep, `"b"`)+4+jsondepth.Max-1] {
			t.Errorf("read %q, %v", got, err)
		}
	}
	var v any
	if err := json.NewDecoder(jsondepth.Reader(strings.NewReader(deep))).Decode(&v); !errors.Is(err, jsondepth.ErrTooDeep) {
		t.Errorf("decoder over Reader: %v", err)
	}
	ok := `{"b":` + nested(jsondepth.Max-1) + `}`
	if got, err := io.ReadAll(jsondepth.Reader(iotest.OneByteReader(strings.NewReader(ok)))); err != nil || string(got) != ok {
		t.Errorf("read %q, %v; want the whole text", got, err)
	}
}
