package provider

import "net/http"

// Handler returns the provider's HTTP API. Every route requires
// Authorization: Bearer <secret>; the secret names the merchant.
//
//	GET    /healthz                           the process is up (no secret)
//	POST   /v1/authorizations                 authorize (201)
//	GET    /v1/authorizations/{id}            read an authorization
//	POST   /v1/authorizations/{id}/capture    capture once, at most the authorized amount (200)
//	POST   /v1/authorizations/{id}/void       void before capture (200)
//	POST   /v1/authorizations/{id}/refunds    refund captured money (201)
//	GET    /v1/idempotency/{key}              the stored answer of the call made with key
//	GET    /v1/effects?since=                 the calls executed with a success since a time, oldest first
//	GET    /admin/counters                    executions per kind
//	POST   /admin/faults                      arm faults (FaultInjection only)
//	DELETE /admin/faults                      clear armed faults (FaultInjection only)
//	POST   /admin/reset                       forget the merchant's state (FaultInjection only)
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/authorizations", s.handleAuthorize)
	mux.HandleFunc("GET /v1/authorizations/{id}", s.handleGetAuthorization)
	mux.HandleFunc("POST /v1/authorizations/{id}/capture", s.handleCapture)
	mux.HandleFunc("POST /v1/authorizations/{id}/void", s.handleVoid)
	mux.HandleFunc("POST /v1/authorizations/{id}/refunds", s.handleRefund)
	mux.HandleFunc("GET /v1/idempotency/{key}", s.handleLookup)
	mux.HandleFunc("GET /v1/effects", s.handleEffects)
	mux.HandleFunc("GET /admin/counters", s.handleCounters)
	if s.cfg.FaultInjection {
		mux.HandleFunc("POST /admin/faults", s.handleArmFault)
		mux.HandleFunc("DELETE /admin/faults", s.handleClearFaults)
		mux.HandleFunc("POST /admin/reset", s.handleReset)
	}
	mux.HandleFunc("/", handleNoRoute)
	// /healthz answers without a secret, like every retrysafe process, so supervisors and tests can wait for it.
	root := http.NewServeMux()
	root.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	root.Handle("/", s.logRequests(requireMerchant(mux)))
	return root
}
