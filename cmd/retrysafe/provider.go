package main

import (
	"context"
	"log/slog"

	"github.com/retrysafe/retrysafe/pkg/httpserver"
	"github.com/retrysafe/retrysafe/pkg/tracing"
	"github.com/retrysafe/retrysafe/services/provider"
)

// serveProvider runs the payment provider sandbox that payments calls over HTTP.
func serveProvider(ctx context.Context, cfg config, logger *slog.Logger) error {
	if cfg.DemoKeys && !cfg.DemoListenAny {
		logger.Warn("API_KEYS is unset (demo mode): the provider sandbox listens on 127.0.0.1 only", "addr", cfg.ProviderAddr)
	}
	if cfg.ProviderFaultInjection {
		logger.Warn("provider fault injection is enabled: /admin/faults can make calls fail, drop or hang")
	}
	srv := provider.NewServer(provider.Config{FaultInjection: cfg.ProviderFaultInjection}, logger)
	return httpserver.Serve(ctx, cfg.ProviderAddr, tracing.Handler(srv.Handler()), logger.With("service", "provider"), cfg.HTTP)
}
