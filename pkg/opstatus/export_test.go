package opstatus

// For the tests of package opstatus_test.
var (
	ErrNotRunning = errNotRunning
	CallOver      = callOver
)
