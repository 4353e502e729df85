package auth_test

import (
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/auth"
)

func TestParseKeys(t *testing.T) {
	t.Parallel()
	keys, err := auth.ParseKeys(" acct_1:agent:s1 , acct_1:approver:s:with:colons,")
	if err != nil {
		t.Fatal(err)
	}
	p, ok := keys.Authenticate("s1")
	if !ok || p.AccountID != "acct_1" || p.Role != auth.RoleAgent || strings.Contains(p.KeyID, "s1") {
		t.Fatalf("s1 -> %+v, %v", p, ok)
	}
	if p, ok := keys.Authenticate("s:with:colons"); !ok || p.Role != auth.RoleApprover {
		t.Fatalf("a secret with colons -> %+v, %v", p, ok)
	}
	for _, bad := range []string{"s", "", "S1", "s1 "} {
		if _, ok := keys.Authenticate(bad); ok {
			t.Errorf("%q authenticated", bad)
		}
	}
	for _, spec := range []string{"", "acct:agent", "acct:root:s3cr3t", ":agent:s3cr3t", "acct:agent:"} {
		if _, err := auth.ParseKeys(spec); err == nil {
			t.Errorf("ParseKeys(%q) accepted", spec)
		} else if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("the error for %q shows the secret: %v", spec, err)
		}
	}
}
