package main

import (
	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/services/deploys"
)

func buildDeploys(cfg config, d service.Deps) (service.Service, error) {
	return deploys.New(d, deploys.Config{
		Target:               deploys.ObserveTarget(deploys.SimulatedTarget{DB: d.DB}, d.Metrics.Downstream("deploy_target")),
		ApprovalEnvironments: cfg.DeployApprovalEnvironments, ApprovalTTL: cfg.ApprovalTTL,
		Steps: cfg.DeploySteps, StepDuration: cfg.DeployStepDuration,
		LockLease: cfg.DeployLockLease, Heartbeat: cfg.DeployHeartbeat,
		PollInterval: cfg.DeployPollInterval, Workers: cfg.DeployWorkers,
		MaxRunningPerAccount: cfg.DeployMaxRunningPerAccount, QueueTimeout: cfg.DeployQueueTimeout,
	})
}
