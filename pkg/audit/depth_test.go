package audit_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/jsondepth"
)

// A bundle nested deeper than jsondepth.Max is not a bundle: VerifyBundle stops at the byte past the limit.
func TestVerifyBundleRefusesDeepJSON(t *testing.T) {
	t.Parallel()
	for _, depth := range []int{jsondepth.Max, 100_000} {
		deep := `{"format":"` + audit.BundleFormat + `","x":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`
		if _, err := audit.VerifyBundle(strings.NewReader(deep), audit.BundleOptions{}); !errors.Is(err, jsondepth.ErrTooDeep) {
			t.Errorf("a bundle %d levels deep: %v; want ErrTooDeep", depth+1, err)
		}
	}
}
