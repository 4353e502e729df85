package conformance

import (
	"errors"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/jsondepth"
)

// A request file whose body nests deeper than jsondepth.Max is refused when it is read; at the limit it is read.
func TestParseSpecRefusesDeepJSON(t *testing.T) {
	t.Parallel()
	spec := func(levels int) string {
		return `{"method":"POST","path":"/x","body":{"a":` + strings.Repeat("[", levels) + strings.Repeat("]", levels) +
			`},"variant":{"a":2},"count":{"command":"echo 0"}}`
	}
	if _, err := ParseSpec([]byte(spec(jsondepth.Max - 2))); err != nil {
		t.Errorf("a spec of %d levels: %v", jsondepth.Max, err)
	}
	if _, err := ParseSpec([]byte(spec(jsondepth.Max - 1))); !errors.Is(err, jsondepth.ErrTooDeep) {
		t.Errorf("a spec of %d levels: %v; want ErrTooDeep", jsondepth.Max+1, err)
	}
	if _, err := reorderJSON([]byte(strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000))); !errors.Is(err, jsondepth.ErrTooDeep) {
		t.Errorf("reordering 100,000 levels: %v; want ErrTooDeep", err)
	}
}
