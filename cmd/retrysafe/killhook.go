package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/retrysafe/retrysafe/pkg/failpoint"
)

// The failpoint conformance case 7 stops a service at, and the line the service prints there.
const (
	claimFailpoint = "idem.after_claim"
	claimReached   = "failpoint " + claimFailpoint + " reached"
)

// killHookCommand is `retrysafe kill-after-claim`: the kill hook of conformance case 7 for any service built on
// pkg/idem, which arms its failpoints from RETRYSAFE_FAILPOINTS by itself (failpoint.FromEnvironment).
func killHookCommand() command {
	return command{
		name:     "kill-after-claim",
		synopsis: "kill-after-claim [--start] --state DIR --health URL -- CMD [ARG...]",
		summary: "conformance case 7's kill hook for a service on pkg/idem: --start runs CMD in the background with " +
			"RETRYSAFE_FAILPOINTS=" + claimFailpoint + "=pause (its pid and output in DIR) and returns once URL answers 200; " +
			"without --start (the request file's kill_hook) it waits for the service to pause at its claim, SIGKILLs it, " +
			"starts CMD again without the failpoint and returns once URL answers; docs/conformance.md",
		noConfig: true,
		check: func(args []string) error {
			_, err := parseKillHook(args)
			return err
		},
		run: runKillHook,
	}
}

type killHook struct {
	start   bool
	state   string
	health  string
	timeout time.Duration
	command []string
}

func parseKillHook(args []string) (killHook, error) {
	fs := flag.NewFlagSet("kill-after-claim", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var k killHook
	fs.BoolVar(&k.start, "start", false, "start CMD with the failpoint armed")
	fs.StringVar(&k.state, "state", "", "directory holding the service's pid and output")
	fs.StringVar(&k.health, "health", "", "URL that answers 200 once the service serves")
	fs.DurationVar(&k.timeout, "timeout", 30*time.Second, "bound on each wait")
	if err := fs.Parse(args); err != nil {
		return k, usageError{"kill-after-claim: " + err.Error()}
	}
	k.command = fs.Args()
	switch {
	case k.state == "":
		return k, usageError{"kill-after-claim needs --state DIR"}
	case !strings.HasPrefix(k.health, "http://") && !strings.HasPrefix(k.health, "https://"):
		return k, usageError{"kill-after-claim needs --health URL, an http:// or https:// URL"}
	case len(k.command) == 0:
		return k, usageError{"kill-after-claim needs the service's command after --"}
	}
	return k, nil
}

func runKillHook(ctx context.Context, inv invocation) error {
	k, err := parseKillHook(inv.args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, k.timeout)
	defer cancel()
	if k.start {
		if err := os.MkdirAll(k.state, 0o700); err != nil {
			return err
		}
		return k.launch(ctx, claimFailpoint+"=pause")
	}
	if err := k.waitForLine(ctx); err != nil {
		return err
	}
	pid, err := k.pid()
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill-after-claim: kill %d: %w", pid, err)
	}
	for syscall.Kill(pid, 0) == nil { // until it is gone and its port free
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("kill-after-claim: process %d still there: %w", pid, err)
		}
	}
	return k.launch(ctx, "")
}

func (k killHook) logPath() string { return filepath.Join(k.state, "service.log") }
func (k killHook) pidPath() string { return filepath.Join(k.state, "service.pid") }

func (k killHook) pid() (int, error) {
	b, err := os.ReadFile(k.pidPath())
	if err != nil {
		return 0, fmt.Errorf("kill-after-claim: %w (was the service started with --start?)", err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// launch starts the command in a session of its own, so it outlives this process, with its output in the state
// directory (a new log each time) and RETRYSAFE_FAILPOINTS set to failpoints; it returns once health answers.
func (k killHook) launch(ctx context.Context, failpoints string) error {
	log, err := os.Create(k.logPath())
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(k.command[0], k.command[1:]...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, failpoint.EnvVar+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if failpoints != "" {
		cmd.Env = append(cmd.Env, failpoint.EnvVar+"="+failpoints)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("kill-after-claim: start %s: %w", k.command[0], err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if err := os.WriteFile(k.pidPath(), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600); err != nil {
		return err
	}
	client := &http.Client{Timeout: time.Second}
	for {
		if res, err := client.Get(k.health); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-exited:
			return fmt.Errorf("kill-after-claim: %s ended before %s answered (%v); its output is in %s", k.command[0], k.health, err, k.logPath())
		case <-ctx.Done():
			return fmt.Errorf("kill-after-claim: %s did not answer: %w", k.health, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitForLine waits until the service says it paused at its claim.
func (k killHook) waitForLine(ctx context.Context) error {
	for {
		b, err := os.ReadFile(k.logPath())
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if bytes.Contains(b, []byte(claimReached)) {
			return nil
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("kill-after-claim: no %q in %s: %w", claimReached, k.logPath(), err)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
