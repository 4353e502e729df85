// Package failpoint lets crash tests stop a real process at a named point, so a test can SIGKILL it there.
//
// A process started with RETRYSAFE_FAILPOINTS=idem.after_claim=pause (comma-separated name=action) prints
// "failpoint <name> reached" to stderr when it gets there and then waits forever (pause) or exits at once
// without cleanup (exit). With the variable unset, Hit costs one map lookup on an empty map.
package failpoint

import (
	"fmt"
	"os"
	"strings"
)

var actions = map[string]string{}

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

// Configure sets the failpoints from a spec like "a=pause,b=exit"; cmd/retrysafe calls it once at start.
func Configure(spec string) error {
	parsed, err := Parse(spec)
	if err != nil {
		return err
	}
	for name, action := range parsed {
		actions[name] = action
	}
	return nil
}

// Hit stops the process at name if a failpoint is configured there.
func Hit(name string) {
	action, ok := actions[name]
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
