package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/retrysafe/retrysafe/pkg/approval"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/deploys"
)

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

func buildDeploys(d deps) (service, error) {
	cfg := d.cfg
	switch {
	case cfg.DeploySteps < 1 || cfg.DeployStepDuration <= 0:
		return service{}, fmt.Errorf("DEPLOY_STEPS (%d) and DEPLOY_STEP_DURATION (%s) must be positive", cfg.DeploySteps, cfg.DeployStepDuration)
	case cfg.DeployHeartbeat <= 0 || 2*cfg.DeployHeartbeat > cfg.DeployLockLease:
		// Two heartbeats fit in a lease, so one slow database round trip does not cost a running deploy its lock.
		return service{}, fmt.Errorf("DEPLOY_HEARTBEAT_INTERVAL (%s) must be positive and at most half of DEPLOY_LOCK_LEASE (%s)",
			cfg.DeployHeartbeat, cfg.DeployLockLease)
	case cfg.DeployPollInterval <= 0 || cfg.DeployWorkers < 1:
		return service{}, fmt.Errorf("DEPLOY_POLL_INTERVAL (%s) and DEPLOY_WORKERS (%d) must be positive", cfg.DeployPollInterval, cfg.DeployWorkers)
	}
	r, err := router(d)
	if err != nil {
		return service{}, err
	}
	logger := d.logger.With("service", "deploys")
	store, target := deploys.PostgresStore{}, deploys.SimulatedTarget{DB: d.db}
	s := &deploys.Server{
		DB: d.db, Store: store, Idem: d.idem, ApprovalEnvironments: cfg.DeployApprovalEnvironments, Steps: cfg.DeploySteps,
	}
	s.Approvals = approval.New(d.db, d.idem, cfg.ApprovalTTL, s.ApprovalRoutes()...)
	deploys.Routes(r.API, s)
	controller := &deploys.Controller{
		DB: d.db, Store: store, Target: target, Logger: logger,
		Steps: cfg.DeploySteps, StepDuration: cfg.DeployStepDuration, Lease: cfg.DeployLockLease,
		Heartbeat: cfg.DeployHeartbeat, PollInterval: cfg.DeployPollInterval, Workers: cfg.DeployWorkers,
	}
	reconciler := &deploys.Reconciler{DB: d.db, Store: store, Target: target}
	return service{
		name: "deploys", addr: cfg.DeploysAddr, handler: r.Engine,
		reconcilers: map[string]opstatus.Reconciler{deploys.KindDeploy: reconciler, deploys.KindRollback: reconciler},
		workers:     []func(ctx context.Context){controller.Run},
	}, nil
}
