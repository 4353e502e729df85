// Package conformancetest runs `retrysafe conformance` (pkg/conformance), with the request files in
// examples/conformance, against the reference services started in-process on test schemas: tickets, payments
// (intent, capture and refund, against the real provider sandbox process) and deploys. It holds only tests.
package conformancetest
