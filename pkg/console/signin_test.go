package console

import (
	"strings"
	"testing"
	"time"
)

// TestSigninTokens: a sign-in token is valid only as this console's secret signed it, and only for signinTTL.
func TestSigninTokens(t *testing.T) {
	t.Parallel()
	c := &console{o: Options{Secret: []byte("secret-one")}}
	other := &console{o: Options{Secret: []byte("secret-two")}}
	now := time.Unix(1_700_000_000, 0)
	token := c.signinToken(now)
	if !c.validSigninToken(token, now) || !c.validSigninToken(token, now.Add(signinTTL-time.Second)) {
		t.Fatal("a fresh token is refused")
	}
	payload, sig, _ := strings.Cut(token, ".")
	for name, bad := range map[string]string{
		"expired":            token,
		"another secret's":   other.signinToken(now),
		"made up":            "attacker-chosen",
		"unsigned":           payload,
		"another signature":  payload + "." + strings.Repeat("A", len(sig)),
		"another payload":    strings.Repeat("A", len(payload)) + "." + sig,
		"issued in a minute": c.signinToken(now.Add(2 * time.Minute)),
	} {
		at := now
		if name == "expired" {
			at = now.Add(signinTTL)
		}
		if c.validSigninToken(bad, at) {
			t.Errorf("a %s token is accepted", name)
		}
	}
}
