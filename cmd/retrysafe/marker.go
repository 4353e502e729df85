package main

import (
	"context"
	"fmt"
	"os"

	"github.com/retrysafe/retrysafe/pkg/agent/opmarker"
)

// markerCommand is `retrysafe marker`, run on a host by an agent's effect command (pkg/agent/opmarker): the
// command runs once per operation id, and a second run returns the recorded result.
func markerCommand() command {
	return command{
		name:     "marker",
		synopsis: "marker --dir DIR --id ID [--operation AOP] -- COMMAND [ARG...]",
		summary: "on a host: run COMMAND once for the operation ID. DIR/ID.marker is created exclusively before it runs " +
			"and DIR/ID.result written after; a second run prints the recorded output and exits with the recorded code " +
			"without running it, or exits 75 when a run started and recorded no result. The last line of standard error " +
			"is the status the agent journals (retrysafe-marker: {...})",
		noConfig: true,
		check: func(args []string) error {
			if len(args) == 0 {
				return usageError{"marker needs --dir DIR --id ID -- COMMAND"}
			}
			return nil
		},
		run: func(_ context.Context, inv invocation) error {
			// The status line must come last on standard error: the command's own output goes before it.
			if code := opmarker.Main(inv.args, os.Stdin, inv.stdout, os.Stderr); code != 0 {
				return exitError{code: code, err: fmt.Errorf("marker: exit %d", code)}
			}
			return nil
		},
	}
}
