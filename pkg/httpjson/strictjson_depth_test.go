package httpjson_test

import (
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/httpjson"
	"github.com/retrysafe/retrysafe/pkg/jsondepth"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// nestedArrays is n levels of arrays: "[[]]" for 2.
func nestedArrays(n int) string {
	return strings.Repeat("[", n) + strings.Repeat("]", n)
}

// allocated runs f once and returns the bytes it allocated (and whatever else ran meanwhile: the tests that
// call it are not parallel, so little else does).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func wantInvalidRequest(t *testing.T, what string, err error) *problem.Error {
	t.Helper()
	var pe *problem.Error
	if !errors.As(err, &pe) || pe.Code != "invalid_request" || pe.Code.Status() != 400 {
		t.Fatalf("%s: got %v, want 400 invalid_request", what, err)
	}
	return pe
}

// TestDecodeJSONBytesRefusesDeepBodiesAtOnce: a body nested 100,000 levels (200 KB) is 400 invalid_request
// before anything walks it, with a few allocations however deep it goes; jsondepth.Max levels still decode, one
// more do not.
func TestDecodeJSONBytesRefusesDeepBodiesAtOnce(t *testing.T) {
	deep := []byte(`{"amount":"1","any":` + nestedArrays(100_000) + `}`)
	var o order
	pe := wantInvalidRequest(t, "100,000 levels", httpjson.DecodeBytes(deep, &o))
	if !strings.Contains(pe.Detail, "64 levels") {
		t.Errorf("detail %q does not say the limit", pe.Detail)
	}
	if n := testing.AllocsPerRun(5, func() { _ = httpjson.DecodeBytes(deep, &o) }); n > 20 {
		t.Errorf("refusing 100,000 levels took %v allocations, want at most 20", n)
	}
	if b := allocated(func() { _ = httpjson.DecodeBytes(deep, &o) }); b > 16<<10 {
		t.Errorf("refusing a %d-byte body allocated %d bytes", len(deep), b)
	}

	// The top-level object is the first level.
	atLimit := `{"any":` + nestedArrays(jsondepth.Max-1) + `}`
	if err := httpjson.DecodeBytes([]byte(atLimit), &o); err != nil {
		t.Errorf("%d levels: %v", jsondepth.Max, err)
	}
	wantInvalidRequest(t, "Max+1 levels", httpjson.DecodeBytes([]byte(`{"any":`+nestedArrays(jsondepth.Max)+`}`), &o))
	wantInvalidRequest(t, "Max+1 levels in a member name's object", httpjson.DecodeBytes([]byte(`{"raw":{"a":{"b":`+nestedArrays(jsondepth.Max-2)+`}}}`), &o))
}

// TestDecodeJSONBytesCostIsLinear: a body within the depth limit costs memory in proportion to its size,
// however long its member names and wide its arrays: a path to a member is only written out for a refusal.
func TestDecodeJSONBytesCostIsLinear(t *testing.T) {
	name := strings.Repeat("n", 4<<10)
	var b strings.Builder
	b.WriteString(`{"any":`)
	const levels = jsondepth.Max - 2
	for range levels {
		b.WriteString(`{"` + name + `":`)
	}
	b.WriteString("[" + strings.Repeat("0,", 4000) + "0]")
	b.WriteString(strings.Repeat("}", levels) + "}")
	body := []byte(b.String())
	var o order
	if err := httpjson.DecodeBytes(body, &o); err != nil {
		t.Fatal(err)
	}
	if got := allocated(func() { _ = httpjson.DecodeBytes(body, &o) }); got > 16*uint64(len(body)) {
		t.Errorf("decoding a %d-byte body allocated %d bytes, more than 16 times its size", len(body), got)
	}
}
