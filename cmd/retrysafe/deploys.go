package main

import (
	"fmt"

	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/services/deploys"
)

func buildDeploys(cfg config, d service.Deps) (service.Service, error) {
	// The simulated target stands for a remote system: with DEPLOY_TARGET_DATABASE_URL its markers live apart
	// from our rows, so a failover of our database does not take them too. The pool lives as long as the process.
	targetDB := d.DB
	if cfg.DeployTargetDatabaseURL != "" {
		db, err := database.Open(cfg.DeployTargetDatabaseURL, database.Options{
			MaxConns: max(cfg.DeployWorkers+2, 4), ConnectTimeout: cfg.DBConnectTimeout, AcquireTimeout: cfg.DBAcquireTimeout,
			StatementTimeout: cfg.DBStatementTimeout,
		})
		if err != nil {
			return nil, fmt.Errorf("open the deploy target's database %s: %w", maskURL(cfg.DeployTargetDatabaseURL), err)
		}
		targetDB = db
	}
	return deploys.New(d, deploys.Config{
		Target:               deploys.ObserveTarget(deploys.SimulatedTarget{DB: targetDB}, d.Metrics.Downstream("deploy_target")),
		ApprovalEnvironments: cfg.DeployApprovalEnvironments, ApprovalTTL: cfg.ApprovalTTL,
		Steps: cfg.DeploySteps, StepDuration: cfg.DeployStepDuration,
		LockLease: cfg.DeployLockLease, Heartbeat: cfg.DeployHeartbeat,
		PollInterval: cfg.DeployPollInterval, Workers: cfg.DeployWorkers,
		MaxRunningPerAccount: cfg.DeployMaxRunningPerAccount, QueueTimeout: cfg.DeployQueueTimeout,
	})
}
