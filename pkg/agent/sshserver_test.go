package agent_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/retrysafe/retrysafe/pkg/agent/opmarker"
)

// TestMain lets the test binary stand in for `retrysafe marker` on the test host: a tools file's marker_helper
// runs it with RETRYSAFE_TEST_MARKER=1. With RETRYSAFE_TEST_WORKER=1 it is a delegated worker (delegate_test.go).
func TestMain(m *testing.M) {
	if os.Getenv("RETRYSAFE_TEST_MARKER") == "1" {
		os.Exit(opmarker.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	if os.Getenv("RETRYSAFE_TEST_WORKER") == "1" {
		os.Exit(runTestWorker())
	}
	os.Exit(m.Run())
}

// Ways the test SSH server loses a connection, by the exec request's number (from 1).
const (
	keep = iota
	// cutAfterRun: the command runs to its end, then the connection is closed without its exit status.
	cutAfterRun
	// cutBeforeRun: the exec request is accepted, then the connection is closed before the command runs.
	cutBeforeRun
)

// sshServer is a real SSH server on 127.0.0.1 (golang.org/x/crypto/ssh) that runs every exec request with
// sh -c, as the test's user, with a throwaway host key and one throwaway client key.
type sshServer struct {
	addr      string
	hostKey   string // SHA256:... fingerprint
	publicKey ssh.PublicKey
	identity  string // the client's private key file
	execs     atomic.Int32
	mu        sync.Mutex
	commands  []string
	// lose says what to do to the n-th exec request's connection.
	lose func(n int) int
}

func startSSHServer(t *testing.T, lose func(n int) int) *sshServer {
	t.Helper()
	_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
	hostSigner, err := ssh.NewSignerFromKey(hostPriv)
	if err != nil {
		t.Fatal(err)
	}
	clientPub, clientPriv, _ := ed25519.GenerateKey(rand.Reader)
	block, err := ssh.MarshalPrivateKey(clientPriv, "")
	if err != nil {
		t.Fatal(err)
	}
	identity := filepath.Join(t.TempDir(), "id_ed25519")
	if err := os.WriteFile(identity, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	authorized, _ := ssh.NewPublicKey(clientPub)
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
		if bytes.Equal(key.Marshal(), authorized.Marshal()) {
			return nil, nil
		}
		return nil, errors.New("unknown key")
	}}
	cfg.AddHostKey(hostSigner)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if lose == nil {
		lose = func(int) int { return keep }
	}
	s := &sshServer{addr: ln.Addr().String(), hostKey: ssh.FingerprintSHA256(hostSigner.PublicKey()), publicKey: hostSigner.PublicKey(),
		identity: identity, lose: lose}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); s.serve(nc, cfg) }()
		}
	}()
	return s
}

func (s *sshServer) serve(nc net.Conn, cfg *ssh.ServerConfig) {
	defer nc.Close()
	_, chans, reqs, err := ssh.NewServerConn(nc, cfg)
	if err != nil {
		return
	}
	go ssh.DiscardRequests(reqs)
	for nch := range chans {
		if nch.ChannelType() != "session" {
			_ = nch.Reject(ssh.UnknownChannelType, "sessions only")
			continue
		}
		ch, requests, err := nch.Accept()
		if err != nil {
			return
		}
		go s.session(nc, ch, requests)
	}
}

// session runs the channel's exec request with sh -c and sends its exit status, or loses the connection as
// lose says.
func (s *sshServer) session(nc net.Conn, ch ssh.Channel, requests <-chan *ssh.Request) {
	defer ch.Close()
	for req := range requests {
		if req.Type != "exec" {
			_ = req.Reply(false, nil)
			continue
		}
		var msg struct{ Command string }
		if err := ssh.Unmarshal(req.Payload, &msg); err != nil {
			_ = req.Reply(false, nil)
			return
		}
		n := int(s.execs.Add(1))
		s.mu.Lock()
		s.commands = append(s.commands, msg.Command)
		s.mu.Unlock()
		_ = req.Reply(true, nil)
		how := s.lose(n)
		if how == cutBeforeRun {
			nc.Close()
			return
		}
		cmd := exec.Command("sh", "-c", msg.Command)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = ch, ch, ch.Stderr()
		code := 0
		if err := cmd.Run(); err != nil {
			code = 255
			if ee, ok := errors.AsType[*exec.ExitError](err); ok {
				code = ee.ExitCode()
			}
		}
		if how == cutAfterRun {
			nc.Close()
			return
		}
		_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(code)}))
		return
	}
}

// knownHostsLine is a known_hosts line giving addr the host key of server.
func knownHostsLine(t *testing.T, addr string, server *sshServer) string {
	t.Helper()
	return knownhosts.Line([]string{knownhosts.Normalize(addr)}, server.publicKey)
}
