package deploys

import (
	"errors"
	"fmt"
	"time"

	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/pkg/approval"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// Config configures the deploys service; cmd/retrysafe fills it from the environment.
type Config struct {
	// Store is PostgresStore and Target the simulated target on the same database when nil.
	Store  Store
	Target Target
	// ApprovalEnvironments need a person's approval for deploys and rollbacks; ApprovalTTL is how long an
	// approval may be used.
	ApprovalEnvironments []string
	ApprovalTTL          time.Duration
	// Steps simulated steps of StepDuration run before activation.
	Steps        int
	StepDuration time.Duration
	// LockLease is how long the release lock stays a worker's without a heartbeat; Heartbeat is at most half
	// of it, so one slow round trip does not cost a running deploy its lock.
	LockLease time.Duration
	Heartbeat time.Duration
	// PollInterval is how often an idle controller worker looks for queued deploys; Workers is how many deploys
	// run at once.
	PollInterval time.Duration
	Workers      int
	// MaxRunningPerAccount caps the deploys of one account running at once (across replicas); the controller
	// starts the next deploy from the account whose last start is oldest. QueueTimeout is how long a deploy
	// may stay queued before it fails with reason queue_timeout and frees its environment's lock. Zero means
	// DefaultMaxRunningPerAccount and DefaultQueueTimeout.
	MaxRunningPerAccount int
	QueueTimeout         time.Duration
}

// Defaults of the controller's fairness: with the usual two workers, a cap of one deploy per account always
// leaves a worker to another account's deploy instead of behind the first account's queue.
const (
	DefaultMaxRunningPerAccount = 1
	DefaultQueueTimeout         = 10 * time.Minute
)

func (c Config) check() error {
	switch {
	case c.Steps < 1 || c.StepDuration <= 0:
		return fmt.Errorf("deploys: Steps (%d) and StepDuration (%s) must be positive", c.Steps, c.StepDuration)
	case c.Heartbeat <= 0 || 2*c.Heartbeat > c.LockLease:
		return fmt.Errorf("deploys: Heartbeat (%s) must be positive and at most half of LockLease (%s)", c.Heartbeat, c.LockLease)
	case c.PollInterval <= 0 || c.Workers < 1:
		return fmt.Errorf("deploys: PollInterval (%s) and Workers (%d) must be positive", c.PollInterval, c.Workers)
	case c.MaxRunningPerAccount < 0 || c.QueueTimeout < 0:
		return fmt.Errorf("deploys: MaxRunningPerAccount (%d) and QueueTimeout (%s) must not be negative", c.MaxRunningPerAccount, c.QueueTimeout)
	case c.ApprovalTTL <= 0:
		return fmt.Errorf("deploys: ApprovalTTL must be positive")
	}
	return nil
}

// Service is the deploys service: the HTTP adapter (Server), the controller that runs queued deploys and the
// reconciler of deploys whose worker died.
type Service struct {
	*Server
	Controller *Controller
	Reconciler *Reconciler
}

// New returns the deploys service after checking cfg.
func New(d service.Deps, cfg Config) (*Service, error) {
	if d.DB == nil || d.Idem == nil {
		return nil, errors.New("deploys: Deps.DB and Deps.Idem are required")
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Store == nil {
		cfg.Store = PostgresStore{}
	}
	if cfg.MaxRunningPerAccount == 0 {
		cfg.MaxRunningPerAccount = DefaultMaxRunningPerAccount
	}
	if cfg.QueueTimeout == 0 {
		cfg.QueueTimeout = DefaultQueueTimeout
	}
	if cfg.Target == nil {
		cfg.Target = SimulatedTarget{DB: d.DB}
	}
	s := &Server{DB: d.DB, Store: cfg.Store, Idem: d.Idem, ApprovalEnvironments: cfg.ApprovalEnvironments, Steps: cfg.Steps,
		Target: cfg.Target, Logger: d.Log().With("service", "deploys")}
	s.Approvals = approval.New(d.Pool, d.Idem, cfg.ApprovalTTL, s.ApprovalRoutes()...)
	return &Service{
		Server: s,
		Controller: &Controller{
			DB: d.DB, Store: cfg.Store, Target: cfg.Target, Logger: d.Log().With("service", "deploys"),
			Steps: cfg.Steps, StepDuration: cfg.StepDuration, Lease: cfg.LockLease,
			Heartbeat: cfg.Heartbeat, PollInterval: cfg.PollInterval, Workers: cfg.Workers,
			MaxRunningPerAccount: cfg.MaxRunningPerAccount, QueueTimeout: cfg.QueueTimeout,
			Observer: d.Idem.OperationObserver(),
		},
		Reconciler: &Reconciler{DB: d.DB, Store: cfg.Store, Target: cfg.Target, Observer: d.Idem.OperationObserver()},
	}, nil
}

var _ service.Service = (*Service)(nil)

// Name implements service.Service.
func (s *Service) Name() string { return "deploys" }

// Reconcilers implements service.Service: one reconciler settles deploys and rollbacks from the target's marker.
func (s *Service) Reconcilers() map[string]opstatus.Reconciler {
	return map[string]opstatus.Reconciler{KindDeploy: s.Reconciler, KindRollback: s.Reconciler}
}

// Workers implements service.Service: the controller.
func (s *Service) Workers() []service.Worker {
	return []service.Worker{{Name: "deploys.controller", Run: s.Controller.Run}}
}
