package client_test

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/retrysafe/retrysafe/api"
	"github.com/retrysafe/retrysafe/api/client"
)

// TestClientMatchesSpec fails when api/openapi.yaml changed and the client was not regenerated (make generate).
func TestClientMatchesSpec(t *testing.T) {
	t.Parallel()
	sum := sha256.Sum256(api.Spec)
	if got := hex.EncodeToString(sum[:]); got != client.SpecSHA256 {
		t.Fatalf("api/openapi.yaml is %s but the client was generated from %s: run make generate", got, client.SpecSHA256)
	}
}
