package provider

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Config is the sandbox's configuration, read once by cmd/retrysafe.
type Config struct {
	// FaultInjection enables /admin/faults and /admin/reset. Off, those routes
	// do not exist (404), so a sandbox left running cannot be made to fail.
	FaultInjection bool
}

// Server is the in-memory payment provider. Its state is guarded by one mutex:
// every execution takes microseconds, and only the delay fault waits, outside it.
type Server struct {
	cfg    Config
	logger *slog.Logger

	mu        sync.Mutex
	merchants map[merchantID]*merchant
}

// NewServer returns an empty provider. A nil logger discards logs.
func NewServer(cfg Config, logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, logger: logger, merchants: make(map[merchantID]*merchant)}
}

// merchantID is a digest of the bearer secret, so the secret itself is neither
// kept nor logged.
type merchantID [sha256.Size]byte

// merchant is everything one bearer secret owns.
type merchant struct {
	authorizations map[string]*Authorization
	keys           map[string]*keyEntry
	counters       map[Kind]int64
	faults         map[Kind][]armedFault // first in, first consumed
	// duplicating is true while an injected FaultDuplicate executes a call the second time: the provider's bug
	// it stands for runs the call again whatever its state, so a capture takes the amount twice.
	duplicating bool
}

func newMerchant() *merchant {
	return &merchant{
		authorizations: make(map[string]*Authorization),
		keys:           make(map[string]*keyEntry),
		counters:       make(map[Kind]int64),
		faults:         make(map[Kind][]armedFault),
	}
}

// merchantLocked returns the state of id, creating it on first use.
// s.mu must be held.
func (s *Server) merchantLocked(id merchantID) *merchant {
	m, ok := s.merchants[id]
	if !ok {
		m = newMerchant()
		s.merchants[id] = m
	}
	return m
}

// answer is a complete HTTP answer, as stored under an idempotency key.
type answer struct {
	status      int
	contentType string
	body        []byte
}

// keyEntry is one idempotency key of one merchant. While the first call with
// the key runs, done is open and later calls wait on it; when it closes,
// stored holds the answer, or the entry has been removed because nothing was
// executed (the key is free again).
type keyEntry struct {
	fingerprint  string
	method, path string
	done         chan struct{}
	stored       *answer
	// effects are the ids of what each execution under the key created or changed.
	effects []string
	// kind, authID (the authorization the call acts on; empty for authorize) and executedAt say what ran, for
	// GET /v1/effects.
	kind       Kind
	authID     string
	executedAt time.Time
}

// claimResult is what claimKey found for a call.
type claimResult struct {
	m      *merchant
	entry  *keyEntry // non-nil when this call owns the key and must execute
	replay *answer   // non-nil when the key's answer is already stored
}

var errKeyReused = errors.New("idempotency key reused with a different request")

// claimKey makes the call the owner of key, or returns the stored answer of an
// identical earlier call, waiting for it if that call is still running.
// It returns errKeyReused if the key was used for a different request, and
// the context's error if the caller gives up while waiting.
func (s *Server) claimKey(ctx context.Context, id merchantID, key, method, path, fingerprint string) (claimResult, error) {
	for {
		s.mu.Lock()
		m := s.merchantLocked(id)
		e, ok := m.keys[key]
		if !ok {
			e = &keyEntry{fingerprint: fingerprint, method: method, path: path, done: make(chan struct{})}
			m.keys[key] = e
			s.mu.Unlock()
			return claimResult{m: m, entry: e}, nil
		}
		if e.fingerprint != fingerprint {
			s.mu.Unlock()
			return claimResult{}, errKeyReused
		}
		if e.stored != nil {
			s.mu.Unlock()
			return claimResult{m: m, replay: e.stored}, nil
		}
		done := e.done
		s.mu.Unlock()

		select {
		case <-done:
		case <-ctx.Done():
			return claimResult{}, ctx.Err()
		}
	}
}

// releaseKey frees a key whose call executed nothing, waking any waiters so
// one of them can claim it.
func (s *Server) releaseKey(m *merchant, key string, e *keyEntry) {
	s.mu.Lock()
	if m.keys[key] == e {
		delete(m.keys, key)
	}
	s.mu.Unlock()
	close(e.done)
}

// execution is the business step of a write: it runs with s.mu held against
// the merchant's state and returns the answer to store. It increments the
// kind's counter itself, and only when it changed state.
type execution func(m *merchant) answer

// serveWrite runs one idempotent write: claim the key, apply any armed fault,
// execute, store the answer, answer. The command must already be decoded and
// validated; fingerprint identifies it.
func (s *Server) serveWrite(w http.ResponseWriter, r *http.Request, kind Kind, fingerprint string, exec execution) {
	id := merchantFrom(r.Context())
	key := r.Header.Get("Idempotency-Key")
	logger := s.logger.With("kind", kind, "idempotency_key", key)

	claim, err := s.claimKey(r.Context(), id, key, r.Method, r.URL.Path, fingerprint)
	switch {
	case errors.Is(err, errKeyReused):
		writeProblem(w, http.StatusUnprocessableEntity, CodeIdempotencyKeyReused,
			"this Idempotency-Key was used for a different request; use a new key for a new request")
		return
	case err != nil:
		// The caller left while an identical call ran; nobody reads this.
		return
	case claim.replay != nil:
		logger.Debug("replayed stored answer", "status", claim.replay.status)
		writeAnswer(w, *claim.replay, true)
		return
	}

	m, e := claim.m, claim.entry
	s.mu.Lock()
	fault := m.takeFault(kind)
	if fault.mode == FaultFail {
		s.mu.Unlock()
		s.releaseKey(m, key, e)
		logger.Info("fault injected: failed before executing")
		writeProblem(w, http.StatusServiceUnavailable, CodeProviderUnavailable,
			"the provider is unavailable (injected fault); nothing was executed")
		return
	}
	ans := exec(m)
	e.stored = &ans
	e.kind, e.authID, e.executedAt = kind, r.PathValue("id"), time.Now()
	e.effects = appendEffect(e.effects, ans)
	if fault.mode == FaultDuplicate {
		m.duplicating = true
		e.effects = appendEffect(e.effects, exec(m))
		m.duplicating = false
	}
	s.mu.Unlock()
	close(e.done)
	logger.Info("executed", "status", ans.status)

	switch fault.mode {
	case FaultDrop, FaultDuplicate:
		logger.Info("fault injected: dropping the connection after executing")
		dropConnection(w)
		return
	case FaultDelay:
		logger.Info("fault injected: delaying the answer", "delay", fault.delay)
		if !sleepCtx(r.Context(), fault.delay) {
			return
		}
	}
	writeAnswer(w, ans, false)
}

// dropConnection closes the client's connection without a byte of answer, so
// the client sees a connection error, never a status.
func dropConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// HTTP/2 or a wrapped writer without Hijack: net/http resets the
		// stream or closes the connection on this panic, without answering.
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

// newID returns prefix followed by 26 random base32 characters.
func newID(prefix string) string {
	return prefix + strings.ToLower(rand.Text())
}

// appendEffect adds the id of what a successful execution created or changed.
func appendEffect(effects []string, a answer) []string {
	if a.status < 200 || a.status >= 300 {
		return effects
	}
	var ref struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(a.body, &ref) == nil && ref.ID != "" {
		effects = append(effects, ref.ID)
	}
	return effects
}
