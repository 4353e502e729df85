package auth_test

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/auth"
)

const (
	s1       = "s1-0123456789abcdefghijklmn"
	colons   = "s:with:colons:0123456789abcdef"
	idSecret = "id-secret-0123456789abcdefghijklmnop"
)

func TestParseKeys(t *testing.T) {
	t.Parallel()
	keys, err := auth.ParseKeys(" acct_1:agent:"+s1+" , acct_1:approver:"+colons+",", idSecret)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := keys.Authenticate(s1)
	if !ok || p.AccountID != "acct_1" || p.Role != auth.RoleAgent || strings.Contains(s1, p.KeyID) {
		t.Fatalf("s1 -> %+v, %v", p, ok)
	}
	if p, ok := keys.Authenticate(colons); !ok || p.Role != auth.RoleApprover {
		t.Fatalf("a secret with colons -> %+v, %v", p, ok)
	}
	for _, bad := range []string{"s", "", strings.ToUpper(s1), s1 + " "} {
		if _, ok := keys.Authenticate(bad); ok {
			t.Errorf("%q authenticated", bad)
		}
	}
	for _, spec := range []string{"", "acct:agent", "acct:root:s3cr3t", ":agent:s3cr3t", "acct:agent:", "acct:agent:s3cr3t-of-23-characters"} {
		if _, err := auth.ParseKeys(spec, idSecret); err == nil {
			t.Errorf("ParseKeys(%q) accepted", spec)
		} else if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("the error for %q shows the secret: %v", spec, err)
		}
	}
}

// TestKeyIDsAreKeyed: a key id is not a hash anyone can compute from a guessed secret; it depends on the id
// secret, and a short id secret is refused. The demo keys alone may have short secrets.
func TestKeyIDsAreKeyed(t *testing.T) {
	t.Parallel()
	a, err := auth.ParseKeys("acct:agent:"+s1, idSecret)
	if err != nil {
		t.Fatal(err)
	}
	b, err := auth.ParseKeys("acct:agent:"+s1, idSecret+"-other")
	if err != nil {
		t.Fatal(err)
	}
	pa, _ := a.Authenticate(s1)
	pb, _ := b.Authenticate(s1)
	unkeyed := sha256.Sum256([]byte(s1))
	if pa.KeyID == pb.KeyID || pa.KeyID == hex.EncodeToString(unkeyed[:6]) || len(pa.KeyID) != 12 {
		t.Errorf("key ids %q and %q: not keyed by the id secret", pa.KeyID, pb.KeyID)
	}
	if _, err := auth.ParseKeys("acct:agent:"+s1, "short"); err == nil {
		t.Error("a short id secret was accepted")
	}
	if _, ok := auth.Demo().Authenticate("demo-agent-secret"); !ok {
		t.Error("the demo keys do not authenticate")
	}
	if _, err := auth.ParseKeys(auth.DemoKeys, idSecret); err == nil {
		t.Error("ParseKeys accepted the demo keys' short secrets")
	}
}

// TestApproverKeysDoNotWrite: an approver key reads and sends the approval endpoints' writes; any other write
// by it is 403 forbidden before its handler runs. An agent key writes.
func TestApproverKeysDoNotWrite(t *testing.T) {
	t.Parallel()
	r := http.NewServeMux()
	ran := map[string]int{}
	handle := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { ran[r.Pattern]++ })
	guard := func(h http.Handler) http.Handler {
		return auth.Middleware(auth.Demo())(auth.AgentWrites("/v1/approvals/{id}/approve")(h))
	}
	for _, pattern := range []string{"GET /v1/things", "POST /v1/things", "PUT /v1/things/{id}", "POST /v1/approvals/{id}/approve"} {
		r.Handle(pattern, guard(handle))
	}
	for _, tc := range []struct {
		secret, method, path string
		status               int
	}{
		{"demo-approver-secret", http.MethodGet, "/v1/things", http.StatusOK},
		{"demo-approver-secret", http.MethodPost, "/v1/things", http.StatusForbidden},
		{"demo-approver-secret", http.MethodPut, "/v1/things/1", http.StatusForbidden},
		{"demo-approver-secret", http.MethodPost, "/v1/approvals/apv_1/approve", http.StatusOK},
		{"demo-agent-secret", http.MethodPost, "/v1/things", http.StatusOK},
		{"demo-agent-secret", http.MethodPut, "/v1/things/1", http.StatusOK},
	} {
		req := httptest.NewRequest(tc.method, tc.path, strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+tc.secret)
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)
		if rec.Code != tc.status || (rec.Code == http.StatusForbidden && !strings.Contains(rec.Body.String(), `"code":"forbidden"`)) {
			t.Errorf("%s %s with %s: %d %s; want %d", tc.method, tc.path, tc.secret, rec.Code, rec.Body, tc.status)
		}
	}
	if ran["POST /v1/things"] != 1 || ran["PUT /v1/things/{id}"] != 1 {
		t.Errorf("handlers ran %v; want each write once, by the agent key", ran)
	}
}
