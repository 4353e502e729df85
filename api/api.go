// Package api embeds openapi.yaml, the machine-readable form of the retrysafe HTTP contract, so tests and tools
// read the same bytes the repository publishes.
package api

import _ "embed"

// Spec is api/openapi.yaml.
//
//go:embed openapi.yaml
var Spec []byte
