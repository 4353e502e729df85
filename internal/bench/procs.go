package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// FreeAddr returns a loopback address with a port that was free a moment ago.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Proc is a server process the harness started; its output goes to a log file.
type Proc struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	mem  *MemSampler
}

// Start runs path with args and env added to this process's environment, output to logPath.
func Start(name, logPath, path string, args, env []string) (*Proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// PID is the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// WaitReady polls url until it answers 200, the process exits, or timeout passes.
func (p *Proc) WaitReady(url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was ready (%v); see %s", p.Name, p.err, p.Log)
		default:
		}
		res, err := http.Get(url)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready at %s after %s; see %s", p.Name, url, timeout, p.Log)
}

// SampleMemory starts sampling the process's resident memory every interval until Stop.
func (p *Proc) SampleMemory(interval time.Duration) *MemSampler {
	p.mem = NewMemSampler(p.PID(), interval)
	return p.mem
}

// Stop sends SIGTERM, waits up to 10 s, then kills. It returns the memory sampler's final figures, if any.
func (p *Proc) Stop() Memory {
	var m Memory
	if p.mem != nil {
		m = p.mem.Stop()
	}
	select {
	case <-p.done:
		return m
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return m
}

// Memory is what a sampler saw of one process, in bytes.
type Memory struct {
	// PeakRSS is the largest VmRSS sampled; HWM the kernel's own high-water mark (VmHWM) at the end, which also
	// covers peaks between samples.
	PeakRSS, HWM int64
	Samples      int
}

// Peak is the larger of the two figures.
func (m Memory) Peak() int64 { return max(m.PeakRSS, m.HWM) }

// MemSampler reads /proc/PID/status periodically.
type MemSampler struct {
	pid  int
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	mem  Memory
	// phase is the largest VmRSS since the last PhasePeak.
	phase int64
}

// PhasePeak returns the largest VmRSS sampled since the last call (a sample is taken now too), and starts over.
func (s *MemSampler) PhasePeak() int64 {
	s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.phase
	s.phase = 0
	return p
}

// NewMemSampler starts sampling pid.
func NewMemSampler(pid int, interval time.Duration) *MemSampler {
	s := &MemSampler{pid: pid, stop: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			s.sample()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *MemSampler) sample() {
	st, err := ReadStatus(s.pid)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mem.Samples++
	s.mem.PeakRSS = max(s.mem.PeakRSS, st["VmRSS"])
	s.phase = max(s.phase, st["VmRSS"])
	s.mem.HWM = max(s.mem.HWM, st["VmHWM"])
}

// Now is the figures so far.
func (s *MemSampler) Now() Memory {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mem
}

// Stop takes a last sample and stops.
func (s *MemSampler) Stop() Memory {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.wg.Wait()
	s.sample()
	return s.Now()
}

// ReadStatus reads the kB figures of /proc/PID/status (VmRSS, VmHWM, ...) in bytes.
func ReadStatus(pid int) (map[string]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseStatus(bufio.NewScanner(f)), nil
}

// ParseStatus reads "Name:  123 kB" lines into bytes; other lines are skipped.
func ParseStatus(sc *bufio.Scanner) map[string]int64 {
	out := map[string]int64{}
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			continue
		}
		if v, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
			out[name] = v * 1024
		}
	}
	return out
}

// run executes a command to completion, its output into the error when it fails.
func run(ctx context.Context, env []string, path string, args ...string) error {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", path, strings.Join(args, " "), err, out)
	}
	return nil
}
