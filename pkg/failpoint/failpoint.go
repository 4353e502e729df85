// Package failpoint lets crash tests stop a real process at a named point, so a test can SIGKILL it there, and
// lets in-process tests run their own code at that point (cut a connection, hang up a client).
//
// A process started with RETRYSAFE_FAILPOINTS=idem.after_claim=pause (comma-separated name=action) prints
// "failpoint <name> reached" to stderr when it gets there and then waits forever (pause) or exits at once
// without cleanup (exit). With nothing configured, Hit costs one atomic load.
package failpoint

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
)

var (
	mu      sync.RWMutex
	actions = map[string]string{}
	hooks   = map[string][]*hook{}
	armed   atomic.Bool
)

// Parse checks a spec like "a=pause,b=exit" and returns its actions by name, changing nothing.
func Parse(spec string) (map[string]string, error) {
	out := map[string]string{}
	for _, entry := range strings.Split(spec, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, action, ok := strings.Cut(entry, "=")
		if !ok || name == "" || (action != "pause" && action != "exit") {
			return nil, fmt.Errorf("failpoint: %q is not name=pause or name=exit", entry)
		}
		out[name] = action
	}
	return out, nil
}

// EnvVar is the environment variable a process's failpoints are read from.
const EnvVar = "RETRYSAFE_FAILPOINTS"

var (
	fromEnvOnce sync.Once
	fromEnvErr  error
)

// FromEnvironment configures the failpoints that RETRYSAFE_FAILPOINTS names, once per process; idem.New calls
// it, so a service built on pkg/idem can be stopped at its claim (conformance case 7) without wiring anything
// into its main. It is the one variable the library reads itself: unset, nothing is armed and Hit stays one
// atomic load; a value that does not parse is an error each call returns.
func FromEnvironment() error {
	fromEnvOnce.Do(func() {
		if spec := os.Getenv(EnvVar); spec != "" {
			if err := Configure(spec); err != nil {
				fromEnvErr = fmt.Errorf("%s: %w", EnvVar, err)
			}
		}
	})
	return fromEnvErr
}

// Configure sets the failpoints from a spec like "a=pause,b=exit"; cmd/retrysafe calls it once at start.
func Configure(spec string) error {
	parsed, err := Parse(spec)
	if err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	for name, action := range parsed {
		actions[name] = action
		armed.Store(true)
	}
	return nil
}

// Set runs fn, in the goroutine that gets there, each time name is hit, until the returned function is called;
// fn gets the detail Hit passes (idem passes the operation). For tests in one process: every function set at a
// name runs, so tests that run at the same time must each act only on what they own (their keys).
func Set(name string, fn func(detail any)) (unset func()) {
	h := &hook{fn: fn}
	mu.Lock()
	hooks[name] = append(hooks[name], h)
	armed.Store(true)
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		kept := hooks[name][:0:0]
		for _, other := range hooks[name] {
			if other != h {
				kept = append(kept, other)
			}
		}
		hooks[name] = kept
	}
}

type hook struct{ fn func(detail any) }

// Hit stops the process at name if a failpoint is configured there, or runs the function Set there with the
// first detail, if any.
func Hit(name string, detail ...any) {
	if !armed.Load() {
		return
	}
	mu.RLock()
	action, ok := actions[name]
	run := hooks[name]
	mu.RUnlock()
	var d any
	if len(detail) > 0 {
		d = detail[0]
	}
	for _, h := range run {
		h.fn(d)
	}
	if !ok {
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint %s reached\n", name)
	switch action {
	case "exit":
		os.Exit(86)
	case "pause":
		select {}
	}
}
