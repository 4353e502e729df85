package idem

import (
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// HeaderKey is the request header that names one intended action.
const HeaderKey = "Idempotency-Key"

// MaxKeyLength is the longest key accepted.
const MaxKeyLength = 255

// ParseKey validates an Idempotency-Key header value: present, 1 to 255 characters, printable ASCII only.
// The key is opaque: it is never trimmed, folded or interpreted.
func ParseKey(value string, present bool) (string, error) {
	if !present {
		return "", problem.New(problem.CodeIdempotencyKeyMissing,
			"this write needs an Idempotency-Key header: one random value (a UUID) per intended action, reused on every retry")
	}
	if value == "" || len(value) > MaxKeyLength {
		return "", problem.New(problem.CodeIdempotencyKeyInvalid, "Idempotency-Key must be 1 to %d characters", MaxKeyLength)
	}
	for i := 0; i < len(value); i++ {
		if value[i] < 0x20 || value[i] > 0x7e {
			return "", problem.New(problem.CodeIdempotencyKeyInvalid, "Idempotency-Key must be printable ASCII")
		}
	}
	return value, nil
}
