package ids_test

import (
	"testing"

	"github.com/retrysafe/retrysafe/pkg/ids"
)

func TestValid(t *testing.T) {
	t.Parallel()
	if id := ids.New("tkt_"); !ids.Valid("tkt_", id) || ids.Valid("pi_", id) {
		t.Errorf("Valid of a new id %q is wrong", id)
	}
	for _, bad := range []string{"", "tkt_", "tkt_\x00", "tkt_0193C1C5-0000-7000-8000-000000000000",
		"tkt_0193c1c5-0000-7000-8000-00000000000", "tkt_0193c1c5-0000-7000-8000-0000000000000",
		"tkt_0193c1c500000-7000-8000-000000000000", "TKT_0193c1c5-0000-7000-8000-000000000000"} {
		if ids.Valid("tkt_", bad) {
			t.Errorf("Valid(%q) = true", bad)
		}
	}
}
