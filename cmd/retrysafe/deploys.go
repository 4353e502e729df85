package main

import (
	"context"

	"github.com/retrysafe/retrysafe/pkg/approval"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/services/deploys"
)

func buildDeploys(d deps) (service, error) {
	cfg := d.cfg
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
