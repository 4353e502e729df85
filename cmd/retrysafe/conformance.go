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

const conformanceUsage = `usage: retrysafe conformance --target URL --request FILE [--report FILE.xml] [--allow HOST:PORT]...
       [--copies N] [--cases 1,2,...] [--timeout D] [--settle D]

Runs the seven fault cases of a retry-safe write against the API at URL, counting the effect before and after each,
prints a table and, with --report, writes JUnit XML. Exit status 0 when every checked case passes, 1 otherwise.
Header values in FILE name secrets as ${ENV_VAR}; their values are never printed. Only URL and the --allow
addresses are contacted.`

// restartCommand is the new caller process of case 3: this binary again, reading the state file the first caller
// stored. Tests that run `run` inside a test binary point it at a built retrysafe binary.
var restartCommand = func() ([]string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return []string{exe, "conformance", "--resume"}, nil
}

// errConformanceFailed is returned when a case failed, so the process exits 1 after the report is printed.
var errConformanceFailed = errors.New("conformance: not every checked case passed")

// runConformance is `retrysafe conformance`. It reads no configuration but the variables the request file names.
func runConformance(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("conformance", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	target := fs.String("target", "", "base URL of the API")
	request := fs.String("request", "", "request file (JSON)")
	report := fs.String("report", "", "write JUnit XML here")
	copies := fs.Int("copies", 0, "concurrent copies in case 2 (default: the file's, else 50)")
	timeout := fs.Duration("timeout", 10*time.Second, "bound of one HTTP request")
	settle := fs.Duration("settle", 15*time.Second, "bound of the retries that wait for a final answer")
	resume := fs.String("resume", "", "") // internal: the new caller process of case 3
	cases := fs.String("cases", "", "run only these cases, e.g. 1,2,4")
	var allow multiFlag
	fs.Var(&allow, "allow", "another host:port the run may contact (a count URL's); repeatable")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%v\n%s", err, conformanceUsage)
	}
	if *resume != "" {
		return conformance.Resume(ctx, *resume, getenv, stdout)
	}
	if *target == "" || *request == "" || fs.NArg() > 0 {
		return fmt.Errorf("%s", conformanceUsage)
	}
	only, err := parseCases(*cases)
	if err != nil {
		return err
	}
	spec, err := conformance.LoadSpec(*request)
	if err != nil {
		return err
	}
	restart, err := restartCommand()
	if err != nil {
		return err
	}
	rep, err := conformance.Run(ctx, spec, conformance.Options{
		Target: *target, Allow: allow, Getenv: getenv, Copies: *copies,
		RequestTimeout: *timeout, SettleTimeout: *settle, RestartCommand: restart, Cases: only,
	})
	if err != nil {
		return err
	}
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if *report != "" {
		f, err := os.Create(*report)
		if err != nil {
			return err
		}
		if err := rep.WriteJUnit(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	if !rep.Passed() {
		return errConformanceFailed
	}
	return nil
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
