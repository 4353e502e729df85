package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// config is read once, here, from the environment; nothing below cmd/ reads the environment.
type config struct {
	DatabaseURL    string
	MigrateOnStart bool
	DBMaxConns     int
	APIKeys        string // secret: never printed
	LogLevel       string
	BodyLimit      int64

	TicketsAddr  string
	PaymentsAddr string
	DeploysAddr  string
	ProviderAddr string
	ProviderURL  string

	IdempotencyRetention time.Duration
	PruneInterval        time.Duration
	OperationLease       time.Duration
	RecoveryInterval     time.Duration
	Failpoints           string

	ProviderFaultInjection bool

	ProviderSecret             string // the payments merchant's secret at the provider: never printed
	ProviderTimeout            time.Duration
	PaymentsApprovalThresholds map[string]int64 // currency -> minor units above which capture/refund need approval
	ApprovalTTL                time.Duration

	DeploySteps                int
	DeployStepDuration         time.Duration
	DeployApprovalEnvironments []string // deploys and rollbacks to these environments need approval
	DeployLockLease            time.Duration
	DeployHeartbeat            time.Duration
	DeployPollInterval         time.Duration
	DeployWorkers              int
}

func loadConfig(getenv func(string) string) (config, error) {
	r := envReader{getenv: getenv}
	cfg := config{
		DatabaseURL:    r.str("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/retrysafe?sslmode=disable"),
		MigrateOnStart: r.boolean("MIGRATE_ON_START", true),
		DBMaxConns:     r.integer("DB_MAX_CONNS", 20),
		APIKeys:        getenv("API_KEYS"),
		LogLevel:       r.str("LOG_LEVEL", "info"),
		BodyLimit:      int64(r.integer("BODY_LIMIT_BYTES", 1<<20)),

		TicketsAddr:  r.str("TICKETS_ADDR", ":8081"),
		PaymentsAddr: r.str("PAYMENTS_ADDR", ":8082"),
		DeploysAddr:  r.str("DEPLOYS_ADDR", ":8083"),
		ProviderAddr: r.str("PROVIDER_ADDR", ":8090"),
		ProviderURL:  r.str("PROVIDER_URL", "http://127.0.0.1:8090"),

		IdempotencyRetention: r.duration("IDEMPOTENCY_RETENTION", 72*time.Hour),
		PruneInterval:        r.duration("PRUNE_INTERVAL", 10*time.Minute),
		OperationLease:       r.duration("OPERATION_LEASE", 30*time.Second),
		RecoveryInterval:     r.duration("RECOVERY_INTERVAL", 5*time.Second),
		Failpoints:           getenv("RETRYSAFE_FAILPOINTS"),

		ProviderFaultInjection: r.boolean("PROVIDER_FAULT_INJECTION", false),

		ProviderSecret:  r.str("PROVIDER_SECRET", "retrysafe-payments-sandbox"),
		ProviderTimeout: r.duration("PROVIDER_TIMEOUT", 5*time.Second),
		ApprovalTTL:     r.duration("APPROVAL_TTL", time.Hour),

		DeploySteps:                r.integer("DEPLOY_STEPS", 3),
		DeployStepDuration:         r.duration("DEPLOY_STEP_DURATION", 2*time.Second),
		DeployApprovalEnvironments: splitList(r.str("DEPLOY_APPROVAL_ENVIRONMENTS", "production")),
		DeployLockLease:            r.duration("DEPLOY_LOCK_LEASE", 30*time.Second),
		DeployHeartbeat:            r.duration("DEPLOY_HEARTBEAT_INTERVAL", 5*time.Second),
		DeployPollInterval:         r.duration("DEPLOY_POLL_INTERVAL", time.Second),
		DeployWorkers:              r.integer("DEPLOY_WORKERS", 2),
	}
	cfg.PaymentsApprovalThresholds, r.err = parseThresholds(r.str("PAYMENTS_APPROVAL_THRESHOLDS", defaultApprovalThresholds), r.err)
	if r.err != nil {
		return config{}, r.err
	}
	if cfg.IdempotencyRetention < 24*time.Hour {
		return config{}, fmt.Errorf("config: IDEMPOTENCY_RETENTION must be at least 24h, got %s", cfg.IdempotencyRetention)
	}
	return cfg, nil
}

// String prints the configuration with secrets masked.
func (c config) String() string {
	keys := "(unset: demo keys)"
	if c.APIKeys != "" {
		keys = fmt.Sprintf("(%d entries, masked)", strings.Count(c.APIKeys, ",")+1)
	}
	return fmt.Sprintf("database=%s api_keys=%s retention=%s lease=%s provider_url=%s provider_secret=(masked) provider_timeout=%s",
		maskURL(c.DatabaseURL), keys, c.IdempotencyRetention, c.OperationLease, c.ProviderURL, c.ProviderTimeout)
}

func maskURL(u string) string {
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok {
		return "(masked)"
	}
	userinfo, host, ok := strings.Cut(rest, "@")
	if !ok {
		return u
	}
	user, _, _ := strings.Cut(userinfo, ":")
	return scheme + "://" + user + ":***@" + host
}

type envReader struct {
	getenv func(string) string
	err    error
}

func (r *envReader) str(name, def string) string {
	if v := r.getenv(name); v != "" {
		return v
	}
	return def
}

func (r *envReader) integer(name string, def int) int {
	v := r.getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("config: %s: %w", name, err)
	}
	return n
}

func (r *envReader) boolean(name string, def bool) bool {
	v := r.getenv(name)
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("config: %s: %w", name, err)
	}
	return b
}

func (r *envReader) duration(name string, def time.Duration) time.Duration {
	v := r.getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("config: %s: %w", name, err)
	}
	return d
}
