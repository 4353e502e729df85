package main

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/console"
	"github.com/retrysafe/retrysafe/pkg/failpoint"
	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/services/deploys"
)

// config is read once, here, from the environment; nothing below cmd/ reads the environment. loadConfig checks
// every variable before the program opens anything, so a bad value is one error naming it and nothing else
// happens.
type config struct {
	DatabaseURL string
	// DatabaseDefaulted is DATABASE_URL unset: a failure to open it says how to find make run's database.
	DatabaseDefaulted bool
	MigrateOnStart    bool
	DBMaxConns        int
	// Bounds on the database waits (pkg/database): a frozen or restarting database is a prompt 503, not a hang.
	DBConnectTimeout   time.Duration
	DBAcquireTimeout   time.Duration
	DBStatementTimeout time.Duration
	APIKeys            string     // secret: never printed
	APIKeyIDSecret     string     // keys the hash that makes key ids (API_KEY_ID_SECRET); secret: never printed
	Keys               *auth.Keys // API_KEYS parsed; the demo keys when it is unset
	// DemoKeys is demo mode: API_KEYS unset, the documented demo keys, and every listener on 127.0.0.1 only
	// unless DemoListenAny (DEMO_LISTEN_ANY, for a container whose ports are published on the host's loopback).
	DemoKeys      bool
	DemoListenAny bool
	LogLevel      string
	BodyLimit     int64
	// RateLimitWritesPerSecond and RateLimitWriteBurst are each account's write budget (a token bucket);
	// zero per second turns the limit off.
	RateLimitWritesPerSecond int
	RateLimitWriteBurst      int
	// AuthFailuresPerMinute and AuthFailureBurst are each client address's budget of refused keys and
	// sign-ins (ratelimit.Failures); zero per minute turns the throttle off.
	AuthFailuresPerMinute int
	AuthFailureBurst      int
	// HTTP holds the connection limits of every listener (httpserver.Limits): HTTP_MAX_CONNS,
	// HTTP_MAX_CONNS_PER_CLIENT (0: no per-client cap), HTTP_IDLE_TIMEOUT, HTTP_TRUSTED_PROXIES.
	HTTP httpserver.Limits
	// ConsoleSecureCookie marks the console's cookies Secure on plain HTTP too, for a TLS proxy in front.
	ConsoleSecureCookie      bool
	ConsoleMaxSessionsPerKey int

	// Ports is RETRYSAFE_PORT_BASE: every listen address and client URL below that is not set is derived from it.
	Ports        demoPorts
	TicketsAddr  string
	PaymentsAddr string
	DeploysAddr  string
	ProviderAddr string
	ProviderURL  string

	IdempotencyRetention time.Duration
	// IdempotencyKeyLifetime is how long a key, its fingerprint and its operation are kept after its response
	// is pruned: it never runs again while it lives.
	IdempotencyKeyLifetime time.Duration
	// IdempotencyKeyOptional lets writes without an Idempotency-Key run unprotected (idem.Handler.KeyOptional).
	IdempotencyKeyOptional bool
	PruneInterval          time.Duration
	OperationLease         time.Duration
	RecoveryInterval       time.Duration
	Failpoints             string

	ProviderFaultInjection bool

	ProviderSecret             string // the payments merchant's secret at the provider: never printed
	ProviderTimeout            time.Duration
	PaymentsApprovalThresholds map[string]int64 // currency -> minor units above which capture/refund need approval
	ApprovalTTL                time.Duration
	PaymentsSweepInterval      time.Duration
	PaymentsSweepCheck         time.Duration
	TicketsApprovalPriorities  []string // new tickets of these priorities need approval
	TicketsApprovalProjects    []string // new tickets in these projects need approval

	DeploySteps                int
	DeployStepDuration         time.Duration
	DeployApprovalEnvironments []string // deploys and rollbacks to these environments need approval
	DeployLockLease            time.Duration
	DeployHeartbeat            time.Duration
	DeployPollInterval         time.Duration
	DeployWorkers              int
	DeployMaxRunningPerAccount int           // deploys of one account running at once, across replicas
	DeployQueueTimeout         time.Duration // a deploy queued longer fails (queue_timeout) and frees its lock
	// DeployTargetDatabaseURL is where the simulated deploy target keeps its markers and fences; empty: in
	// DatabaseURL, beside the services' tables.
	DeployTargetDatabaseURL string

	AuditSealInterval time.Duration
	AuditSigningKey   *auditchain.Signer // AUDIT_SIGNING_KEY parsed (nil: unsigned seals); never printed
}

// The demo's ports, as offsets from RETRYSAFE_PORT_BASE (default 8080): tickets 8081, payments 8082, deploys
// 8083, the payment provider sandbox 8090, and a spare tickets for the kill hook of conformance case 7
// (docs/conformance.md) 8091. One setting moves the whole demo, and every client default follows it: the
// services' listen addresses, payments' PROVIDER_URL, the agent's TICKETS_URL, PAYMENTS_URL and DEPLOYS_URL, and
// what `retrysafe env` prints for a shell.
const (
	defaultPortBase = 8080
	ticketsPort     = 1
	paymentsPort    = 2
	deploysPort     = 3
	providerPort    = 10
	killHookPort    = 11
	maxPortOffset   = killHookPort
)

// demoPorts places the demo's processes from one base port.
type demoPorts struct{ base int }

func (p demoPorts) port(offset int) int    { return p.base + offset }
func (p demoPorts) addr(offset int) string { return ":" + strconv.Itoa(p.port(offset)) }
func (p demoPorts) url(offset int) string  { return "http://127.0.0.1:" + strconv.Itoa(p.port(offset)) }

// serviceURLs are the demo services' base URLs by the variable an agent reads each from (pkg/agent/demo-tools.yaml).
func (p demoPorts) serviceURLs() map[string]string {
	return map[string]string{
		"TICKETS_URL": p.url(ticketsPort), "PAYMENTS_URL": p.url(paymentsPort), "DEPLOYS_URL": p.url(deploysPort),
	}
}

// readPorts reads RETRYSAFE_PORT_BASE alone, for the commands that read no other configuration (agent, mcp).
func readPorts(getenv func(string) string) (demoPorts, error) {
	r := envReader{getenv: getenv}
	p := r.portBase()
	return p, r.err
}

// withDemoURLs answers the demo services' URL variables that are unset from the port base, so an agent finds
// the demo wherever RETRYSAFE_PORT_BASE put it.
func withDemoURLs(getenv func(string) string, p demoPorts) func(string) string {
	urls := p.serviceURLs()
	return func(name string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return urls[name]
	}
}

// configError is a bad configuration value: the program stops before any effect, with exit code 2.
type configError struct{ msg string }

func (e configError) Error() string { return "config: " + e.msg }

func loadConfig(getenv func(string) string) (config, error) {
	r := envReader{getenv: getenv}
	// Read in the order the variables are checked: the first bad one is the error.
	cfg := config{APIKeys: getenv("API_KEYS"), APIKeyIDSecret: getenv("API_KEY_ID_SECRET"),
		Failpoints: getenv("RETRYSAFE_FAILPOINTS"), DatabaseDefaulted: getenv("DATABASE_URL") == ""}
	cfg.readDatabase(&r)
	cfg.readHTTP(&r)
	cfg.Ports = r.portBase()
	cfg.readIdempotency(&r)
	cfg.readProvider(&r)
	cfg.readDeploys(&r)
	cfg.readAddresses(&r)
	cfg.readAudit(&r)
	cfg.readApprovalRules(&r)
	if r.err != nil {
		return config{}, r.err
	}
	if _, err := failpoint.Parse(cfg.Failpoints); err != nil {
		return config{}, configError{"RETRYSAFE_FAILPOINTS: " + err.Error()}
	}
	cfg.DemoListenAny = r.boolean("DEMO_LISTEN_ANY", false)
	if r.err != nil {
		return config{}, r.err
	}
	if err := cfg.readKeys(); err != nil {
		return config{}, err
	}
	if err := cfg.check(); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// readDatabase reads where the database is and the bounds of its pool and waits.
func (c *config) readDatabase(r *envReader) {
	c.DatabaseURL = r.postgresURL("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/retrysafe?sslmode=disable")
	c.MigrateOnStart = r.boolean("MIGRATE_ON_START", true)
	c.DBMaxConns = r.integer("DB_MAX_CONNS", 20, 1, 1000)
	c.DBConnectTimeout = r.duration("DB_CONNECT_TIMEOUT", 3*time.Second)
	c.DBAcquireTimeout = r.duration("DB_ACQUIRE_TIMEOUT", 3*time.Second)
	c.DBStatementTimeout = r.duration("DB_STATEMENT_TIMEOUT", 5*time.Second)
}

// readHTTP reads the log level and what bounds the HTTP side: the body limit, the rate limits, the connection
// limits and the console's sessions.
func (c *config) readHTTP(r *envReader) {
	c.LogLevel = r.oneOf("LOG_LEVEL", "info", "debug", "info", "warn", "error")
	c.BodyLimit = int64(r.integer("BODY_LIMIT_BYTES", 1<<20, 1024, 1<<30))
	c.RateLimitWritesPerSecond = r.integer("RATE_LIMIT_WRITES_PER_SECOND", 50, 0, 1_000_000)
	c.RateLimitWriteBurst = r.integer("RATE_LIMIT_WRITE_BURST", 200, 1, 1_000_000)
	c.AuthFailuresPerMinute = r.integer("AUTH_FAILURES_PER_MINUTE", 30, 0, 1_000_000)
	c.AuthFailureBurst = r.integer("AUTH_FAILURE_BURST", 20, 1, 1_000_000)
	c.HTTP = httpserver.Limits{
		MaxConns:          r.integer("HTTP_MAX_CONNS", httpserver.DefaultMaxConns, 1, 1_000_000),
		MaxConnsPerClient: r.integer("HTTP_MAX_CONNS_PER_CLIENT", httpserver.DefaultMaxConnsPerClient, 0, 1_000_000),
		IdleTimeout:       r.duration("HTTP_IDLE_TIMEOUT", httpserver.DefaultIdleTimeout),
		TrustedProxies:    r.prefixes("HTTP_TRUSTED_PROXIES"),
	}
	c.ConsoleSecureCookie = r.boolean("CONSOLE_SECURE_COOKIE", false)
	c.ConsoleMaxSessionsPerKey = r.integer("CONSOLE_MAX_SESSIONS_PER_KEY", console.DefaultMaxSessionsPerKey, 1, 1000)
}

// readIdempotency reads how long keys and responses are kept and the leases of operations.
func (c *config) readIdempotency(r *envReader) {
	c.IdempotencyRetention = r.duration("IDEMPOTENCY_RETENTION", 72*time.Hour)
	c.IdempotencyKeyLifetime = r.duration("IDEMPOTENCY_KEY_LIFETIME", 90*24*time.Hour)
	c.IdempotencyKeyOptional = r.boolean("IDEMPOTENCY_KEY_OPTIONAL", false)
	c.PruneInterval = r.duration("PRUNE_INTERVAL", 10*time.Minute)
	c.OperationLease = r.duration("OPERATION_LEASE", 30*time.Second)
	c.RecoveryInterval = r.duration("RECOVERY_INTERVAL", 5*time.Second)
}

// readProvider reads the payment provider's settings and how long an approval lasts.
func (c *config) readProvider(r *envReader) {
	c.ProviderFaultInjection = r.boolean("PROVIDER_FAULT_INJECTION", false)
	c.ProviderSecret = r.str("PROVIDER_SECRET", "retrysafe-payments-sandbox")
	c.ProviderTimeout = r.duration("PROVIDER_TIMEOUT", 5*time.Second)
	c.ApprovalTTL = r.duration("APPROVAL_TTL", time.Hour)
	c.PaymentsSweepInterval = r.duration("PAYMENTS_SWEEP_INTERVAL", time.Minute)
	c.PaymentsSweepCheck = r.duration("PAYMENTS_SWEEP_CHECK", 5*time.Second)
}

// readDeploys reads the deploy controller's steps, approvals, locks and concurrency.
func (c *config) readDeploys(r *envReader) {
	c.DeploySteps = r.integer("DEPLOY_STEPS", 3, 1, 100)
	c.DeployStepDuration = r.duration("DEPLOY_STEP_DURATION", 2*time.Second)
	c.DeployApprovalEnvironments = splitList(r.str("DEPLOY_APPROVAL_ENVIRONMENTS", "production"))
	c.DeployLockLease = r.duration("DEPLOY_LOCK_LEASE", 30*time.Second)
	c.DeployHeartbeat = r.duration("DEPLOY_HEARTBEAT_INTERVAL", 5*time.Second)
	c.DeployPollInterval = r.duration("DEPLOY_POLL_INTERVAL", time.Second)
	c.DeployWorkers = r.integer("DEPLOY_WORKERS", 2, 1, 64)
	c.DeployMaxRunningPerAccount = r.integer("DEPLOY_MAX_RUNNING_PER_ACCOUNT", deploys.DefaultMaxRunningPerAccount, 1, 64)
	c.DeployQueueTimeout = r.duration("DEPLOY_QUEUE_TIMEOUT", deploys.DefaultQueueTimeout)
	if r.getenv("DEPLOY_TARGET_DATABASE_URL") != "" {
		c.DeployTargetDatabaseURL = r.postgresURL("DEPLOY_TARGET_DATABASE_URL", "")
	}
}

// readAddresses reads the listen addresses and the provider's URL, each by default from the port base.
func (c *config) readAddresses(r *envReader) {
	c.TicketsAddr = r.addr("TICKETS_ADDR", c.Ports.addr(ticketsPort))
	c.PaymentsAddr = r.addr("PAYMENTS_ADDR", c.Ports.addr(paymentsPort))
	c.DeploysAddr = r.addr("DEPLOYS_ADDR", c.Ports.addr(deploysPort))
	c.ProviderAddr = r.addr("PROVIDER_ADDR", c.Ports.addr(providerPort))
	c.ProviderURL = r.httpURL("PROVIDER_URL", c.Ports.url(providerPort))
}

// readAudit reads how often audit records are sealed and the key that signs the seals.
func (c *config) readAudit(r *envReader) {
	c.AuditSealInterval = r.duration("AUDIT_SEAL_INTERVAL", audit.DefaultSealInterval)
	if v := r.getenv("AUDIT_SIGNING_KEY"); v != "" {
		signer, err := auditchain.ParseSigningKey(v)
		if err != nil && r.err == nil {
			r.err = configError{"AUDIT_SIGNING_KEY: " + strings.TrimPrefix(err.Error(), "auditchain: signing key: ")}
		}
		c.AuditSigningKey = signer
	}
}

// readApprovalRules reads which payments, tickets' projects and tickets' priorities need approval.
func (c *config) readApprovalRules(r *envReader) {
	c.PaymentsApprovalThresholds = r.thresholds("PAYMENTS_APPROVAL_THRESHOLDS", defaultApprovalThresholds)
	c.TicketsApprovalProjects = splitList(r.str("TICKETS_APPROVAL_PROJECTS", ""))
	c.TicketsApprovalPriorities = splitList(r.str("TICKETS_APPROVAL_PRIORITIES", ""))
	for _, p := range c.TicketsApprovalPriorities {
		if !slices.Contains([]string{"low", "normal", "high", "urgent"}, p) && r.err == nil {
			r.err = configError{fmt.Sprintf("TICKETS_APPROVAL_PRIORITIES: %q is not a priority (low, normal, high, urgent)", p)}
		}
	}
}

// readKeys takes the demo keys when API_KEYS is unset (listening on loopback only unless DEMO_LISTEN_ANY), and
// parses API_KEYS, keyed by API_KEY_ID_SECRET, otherwise.
func (c *config) readKeys() error {
	if c.APIKeys == "" {
		c.Keys, c.DemoKeys = auth.Demo(), true
		if c.DemoListenAny {
			return nil
		}
		return c.loopbackOnly()
	}
	if len(c.APIKeyIDSecret) < auth.MinIDSecretLength {
		return configError{fmt.Sprintf("API_KEY_ID_SECRET: set it to a random value of at least %d characters when API_KEYS is set (it keys the hash that makes key ids)", auth.MinIDSecretLength)}
	}
	keys, err := auth.ParseKeys(c.APIKeys, c.APIKeyIDSecret)
	if err != nil {
		return configError{"API_KEYS: " + err.Error()}
	}
	c.Keys = keys
	return nil
}

// loopbackOnly makes demo mode listen on 127.0.0.1 only: its keys are published in the README, so a service
// reachable from another machine would take writes from anyone. An address without a host (":8081") or with
// an unspecified one (0.0.0.0, ::) becomes 127.0.0.1; any other host that is not loopback is a config error.
// DEMO_LISTEN_ANY=true leaves the addresses as given, for a container: its network is its own, and the host
// publishes its ports on 127.0.0.1 (docker-compose.yml).
func (c *config) loopbackOnly() error {
	for _, a := range []struct {
		name string
		addr *string
	}{{"TICKETS_ADDR", &c.TicketsAddr}, {"PAYMENTS_ADDR", &c.PaymentsAddr}, {"DEPLOYS_ADDR", &c.DeploysAddr}, {"PROVIDER_ADDR", &c.ProviderAddr}} {
		host, port, _ := net.SplitHostPort(*a.addr) // checked by envReader.addr
		ip := net.ParseIP(host)
		switch {
		case host == "" || (ip != nil && ip.IsUnspecified()):
			*a.addr = net.JoinHostPort("127.0.0.1", port)
		case host == "localhost" || (ip != nil && ip.IsLoopback()):
		default:
			return configError{fmt.Sprintf("%s: %q is not a loopback address; with API_KEYS unset (the published demo keys) "+
				"the services listen on 127.0.0.1 only: set API_KEYS and API_KEY_ID_SECRET to listen elsewhere", a.name, *a.addr)}
		}
	}
	return nil
}

// check holds the rules that tie two variables together.
func (c config) check() error {
	switch {
	case c.IdempotencyRetention < 24*time.Hour:
		return configError{fmt.Sprintf("IDEMPOTENCY_RETENTION must be at least 24h, got %s", c.IdempotencyRetention)}
	case c.IdempotencyKeyLifetime < c.IdempotencyRetention:
		return configError{fmt.Sprintf("IDEMPOTENCY_KEY_LIFETIME must be at least IDEMPOTENCY_RETENTION (%s), got %s", c.IdempotencyRetention, c.IdempotencyKeyLifetime)}
	case c.ProviderTimeout >= c.OperationLease:
		// The lease bounds how long a provider call may run before the reconciler may conclude it never
		// executed; a call allowed to outlive it could execute after that conclusion.
		return configError{fmt.Sprintf("PROVIDER_TIMEOUT (%s) must be below OPERATION_LEASE (%s)", c.ProviderTimeout, c.OperationLease)}
	case 2*c.DeployHeartbeat > c.DeployLockLease:
		// Two heartbeats fit in a lease, so one slow database round trip does not cost a running deploy its lock.
		return configError{fmt.Sprintf("DEPLOY_HEARTBEAT_INTERVAL (%s) must be at most half of DEPLOY_LOCK_LEASE (%s)",
			c.DeployHeartbeat, c.DeployLockLease)}
	}
	return nil
}

// String prints the configuration with secrets masked.
func (c config) String() string {
	keys := "(unset: demo keys)"
	if c.APIKeys != "" {
		keys = fmt.Sprintf("(%d entries, masked)", strings.Count(c.APIKeys, ",")+1)
	}
	target := "(database)"
	if c.DeployTargetDatabaseURL != "" {
		target = maskURL(c.DeployTargetDatabaseURL)
	}
	return fmt.Sprintf("database=%s db_timeouts=connect:%s,acquire:%s,statement:%s api_keys=%s api_key_id_secret=(masked) retention=%s lease=%s provider_url=%s provider_secret=(masked) provider_timeout=%s deploy_target_database=%s",
		maskURL(c.DatabaseURL), c.DBConnectTimeout, c.DBAcquireTimeout, c.DBStatementTimeout, keys, c.IdempotencyRetention, c.OperationLease, c.ProviderURL, c.ProviderTimeout, target)
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

// splitList reads a comma-separated list such as DEPLOY_APPROVAL_ENVIRONMENTS, dropping empty entries.
func splitList(spec string) []string {
	var out []string
	for _, item := range strings.Split(spec, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// envReader reads typed variables and keeps the first error, which names its variable.
type envReader struct {
	getenv func(string) string
	err    error
}

func (r *envReader) fail(name, format string, args ...any) {
	if r.err == nil {
		r.err = configError{name + ": " + fmt.Sprintf(format, args...)}
	}
}

func (r *envReader) str(name, def string) string {
	if v := r.getenv(name); v != "" {
		return v
	}
	return def
}

func (r *envReader) oneOf(name, def string, allowed ...string) string {
	v := r.str(name, def)
	for _, a := range allowed {
		if v == a {
			return v
		}
	}
	r.fail(name, "%q is not one of %s", v, strings.Join(allowed, ", "))
	return def
}

func (r *envReader) integer(name string, def, lo, hi int) int {
	v := r.getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		r.fail(name, "%q is not a whole number from %d to %d", v, lo, hi)
		return def
	}
	return n
}

func (r *envReader) boolean(name string, def bool) bool {
	v := r.getenv(name)
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.fail(name, "%q is not true or false", v)
		return def
	}
	return b
}

// duration reads a positive Go duration such as 30s or 5m.
func (r *envReader) duration(name string, def time.Duration) time.Duration {
	v := r.getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		r.fail(name, "%q is not a positive duration such as 30s or 5m", v)
		return def
	}
	return d
}

// addr reads a listen address, host:port or :port.
func (r *envReader) addr(name, def string) string {
	v := r.str(name, def)
	_, port, err := net.SplitHostPort(v)
	if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 0 || n > 65535 {
		r.fail(name, "%q is not a listen address such as :8081 or 127.0.0.1:8081", v)
		return def
	}
	return v
}

// portBase reads RETRYSAFE_PORT_BASE: every demo port is an offset from it, so the highest must fit.
func (r *envReader) portBase() demoPorts {
	return demoPorts{base: r.integer("RETRYSAFE_PORT_BASE", defaultPortBase, 1, 65535-maxPortOffset)}
}

// prefixes reads a comma-separated list of IP addresses and CIDR prefixes, such as 10.0.0.0/8,192.0.2.7.
func (r *envReader) prefixes(name string) []netip.Prefix {
	var out []netip.Prefix
	for _, item := range splitList(r.getenv(name)) {
		p, err := netip.ParsePrefix(item)
		if err != nil {
			a, aerr := netip.ParseAddr(item)
			if aerr != nil {
				r.fail(name, "%q is not an IP address or a CIDR prefix such as 10.0.0.0/8", item)
				return nil
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out
}

func (r *envReader) postgresURL(name, def string) string {
	v := r.str(name, def)
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		// The value may hold a password: name the variable, never echo it.
		r.fail(name, "not a postgres://user@host:port/database URL")
		return def
	}
	return v
}

func (r *envReader) httpURL(name, def string) string {
	v := r.str(name, def)
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		r.fail(name, "%q is not an http:// or https:// URL", v)
		return def
	}
	return v
}
