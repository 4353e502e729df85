package main

import (
	"strings"
	"testing"
	"time"
)

func TestPaymentsConfig(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(env(map[string]string{"PROVIDER_SECRET": "sk_live_shh"}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ProviderTimeout != 5*time.Second || cfg.ApprovalTTL != time.Hour ||
		cfg.PaymentsApprovalThresholds["USD"] != 100000 || cfg.PaymentsApprovalThresholds["JPY"] != 100000 {
		t.Errorf("payments defaults: timeout %s, ttl %s, thresholds %v", cfg.ProviderTimeout, cfg.ApprovalTTL, cfg.PaymentsApprovalThresholds)
	}
	if strings.Contains(cfg.String(), "sk_live_shh") {
		t.Errorf("config prints the provider secret: %s", cfg)
	}

	for _, bad := range []string{"USD", "USD:-1", "usd:100", "XXX:100", "USD:1.5"} {
		if _, err := loadConfig(env(map[string]string{"PAYMENTS_APPROVAL_THRESHOLDS": bad})); err == nil ||
			!strings.Contains(err.Error(), "PAYMENTS_APPROVAL_THRESHOLDS") {
			t.Errorf("PAYMENTS_APPROVAL_THRESHOLDS=%q: %v; want an error naming it", bad, err)
		}
	}

	// A provider call that may outlive the lease could execute after the reconciler concluded it never did.
	if _, err := loadConfig(env(map[string]string{"PROVIDER_TIMEOUT": "30s", "OPERATION_LEASE": "30s"})); err == nil ||
		!strings.Contains(err.Error(), "PROVIDER_TIMEOUT") {
		t.Errorf("PROVIDER_TIMEOUT = OPERATION_LEASE: %v; want an error naming PROVIDER_TIMEOUT", err)
	}
}
