package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/pkg/conformance"
)

// conformanceCommand is `retrysafe conformance`: it reads no configuration, only the variables the request file
// names, so it runs anywhere without DATABASE_URL.
var conformanceCommand = command{
	name: "conformance", synopsis: "conformance --target URL --request FILE [--report FILE.xml]",
	summary:  "check that a write endpoint of any HTTP API can be retried safely (docs/conformance.md)",
	noConfig: true,
	check: func(args []string) error {
		_, err := parseConformanceFlags(args)
		return err
	},
	run: func(ctx context.Context, inv invocation) error {
		return runConformance(ctx, inv.args, inv.getenv, inv.stdout)
	},
	env: `  ${NAME}                   each variable the request file's headers name (a secret): read, never printed
  CONFORMANCE_<NAME>        set for the count command: {{unique}} and each value a setup step saved (from the
                            target: the command uses them as data, never splices them into shell or SQL)
  Flags: ` + conformanceFlagsHelp,
}

const conformanceFlagsHelp = `--target URL --request FILE [--report FILE.xml] [--allow HOST:PORT]... [--copies N]
         [--cases 1,2,...] [--timeout 10s] [--settle 15s]
  Exit 0 when every checked case passed, 1 when one failed, 2 when the invocation or the request file is wrong
  (nothing was sent). Only URL and the --allow addresses are contacted.`

// restartCommand is the new caller process of case 3: this binary again, reading the state file the first caller
// stored. Tests that run `run` inside a test binary point it at a built retrysafe binary.
var restartCommand = func() ([]string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return []string{exe, "conformance", "--resume"}, nil
}

// errConformanceFailed is returned (exit code 1) when a checked case did not pass, after the report is printed.
var errConformanceFailed = errors.New("conformance: not every checked case passed")

type conformanceFlags struct {
	target, request, report, resume string
	copies                          int
	timeout, settle                 time.Duration
	cases                           []int
	allow                           []string
}

func parseConformanceFlags(args []string) (conformanceFlags, error) {
	var f conformanceFlags
	fs := flag.NewFlagSet("conformance", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.target, "target", "", "base URL of the API")
	fs.StringVar(&f.request, "request", "", "request file (JSON)")
	fs.StringVar(&f.report, "report", "", "write JUnit XML here")
	fs.IntVar(&f.copies, "copies", 0, "concurrent copies in case 2 (default: the file's, else 50)")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "bound of one HTTP request")
	fs.DurationVar(&f.settle, "settle", 15*time.Second, "bound of the retries that wait for a final answer")
	fs.StringVar(&f.resume, "resume", "", "") // internal: the new caller process of case 3
	cases := fs.String("cases", "", "run only these cases, e.g. 1,2,4")
	var allow multiFlag
	fs.Var(&allow, "allow", "another host:port the run may contact (a count URL's); repeatable")
	if err := fs.Parse(args); err != nil {
		return f, usageError{"conformance: " + err.Error()}
	}
	f.allow = allow
	if f.resume != "" {
		return f, nil
	}
	if f.target == "" || f.request == "" || fs.NArg() > 0 {
		return f, usageError{"usage: retrysafe conformance " + conformanceFlagsHelp}
	}
	var err error
	if f.cases, err = parseCases(*cases); err != nil {
		return f, usageError{err.Error()}
	}
	return f, nil
}

// runConformance is `retrysafe conformance`.
func runConformance(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	f, err := parseConformanceFlags(args)
	if err != nil {
		return err
	}
	if f.resume != "" {
		return conformance.Resume(ctx, f.resume, getenv, stdout)
	}
	spec, err := conformance.LoadSpec(f.request)
	if err != nil {
		return exitError{code: 2, err: err}
	}
	restart, err := restartCommand()
	if err != nil {
		return err
	}
	rep, err := conformance.Run(ctx, spec, conformance.Options{
		Target: f.target, Allow: f.allow, Getenv: getenv, Copies: f.copies,
		RequestTimeout: f.timeout, SettleTimeout: f.settle, RestartCommand: restart, Cases: f.cases,
	})
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		return exitError{code: 2, err: err} // refused before anything was sent
	}
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if f.report != "" {
		if err := writeJUnit(f.report, rep); err != nil {
			return err
		}
	}
	if !rep.Passed() {
		return exitError{code: 1, err: errConformanceFailed}
	}
	return nil
}

func writeJUnit(path string, rep *conformance.Report) error {
	file, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rep.WriteJUnit(file); err != nil {
		file.Close()
		return err
	}
	return file.Close()
}

func parseCases(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("--cases: %q is not a case number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }
