// Package failovertest is the database failover test, `make test-failover` (docs/failover.md): a
// PostgreSQL primary and a streaming-replication standby started by scripts/failover.sh on ports of their own,
// the payment provider sandbox and the three services as processes of the real binary on the multi-host URL,
// load on all three, the primary killed with SIGKILL and the standby promoted; then what became of every write,
// counted on the new primary and at the provider, and the old primary brought back as a standby.
//
// It runs only with RETRYSAFE_FAILOVER=1 (make test-failover sets it): it starts clusters of its own and takes
// minutes, so `make test` skips it.
package failovertest
