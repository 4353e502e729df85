package main

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// envCommand is `retrysafe env`: the shell line that points a terminal at the demo `make run` serves, so the
// README's commands, the agent and the audit commands all find it wherever RETRYSAFE_PORT_BASE put it.
func envCommand() command {
	return command{
		name: "env", synopsis: "env",
		summary: "print one shell line that exports where the demo runs (RETRYSAFE_PORT_BASE, the services' and " +
			"the provider's URLs, DATABASE_URL): eval \"$(retrysafe env)\", or `make -s env`, which also finds the " +
			"database `make run` uses",
		check: noArgs("env"), noConfig: true, run: runEnv,
		env: `  RETRYSAFE_PORT_BASE       the demo's base port (default 8080), as for serve
  DATABASE_URL              printed as it is, unless it holds a password (then export it yourself)`,
	}
}

func runEnv(_ context.Context, inv invocation) error {
	ports, err := readPorts(inv.getenv)
	if err != nil {
		return err
	}
	vars := [][2]string{
		{"RETRYSAFE_PORT_BASE", strconv.Itoa(ports.base)},
		{"TICKETS_URL", ports.url(ticketsPort)},
		{"PAYMENTS_URL", ports.url(paymentsPort)},
		{"DEPLOYS_URL", ports.url(deploysPort)},
		{"PROVIDER_URL", ports.url(providerPort)},
		{"KILL_HOOK_PORT", strconv.Itoa(ports.port(killHookPort))},
	}
	if db := inv.getenv("DATABASE_URL"); db != "" {
		if u, err := url.Parse(db); err == nil {
			if _, hasPassword := u.User.Password(); !hasPassword {
				vars = append(vars, [2]string{"DATABASE_URL", db})
			}
		}
	}
	line := make([]string, len(vars))
	for i, v := range vars {
		line[i] = v[0] + "=" + shellQuote(v[1])
	}
	_, err = fmt.Fprintln(inv.stdout, "export "+strings.Join(line, " "))
	return err
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
