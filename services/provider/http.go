package provider

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/retrysafe/retrysafe/pkg/jsondepth"
	"github.com/retrysafe/retrysafe/pkg/money"
)

const (
	maxMetadata        = 20
	maxMetadataText    = 255
	maxBodyBytes       = 1 << 20
	maxKeyLength       = 255
	maxReferenceLength = 255
)

func (s *Server) handleAuthorize(w http.ResponseWriter, r *http.Request) {
	var req AuthorizeRequest
	if !decodeWrite(w, r, &req) {
		return
	}
	var errs []fieldError
	if _, err := money.FromMinor(req.Currency, req.AmountMinor); err != nil {
		var fe *money.FieldError
		if !errors.As(err, &fe) {
			writeInternal(w, s.logger, err)
			return
		}
		errs = append(errs, fieldError{Field: fe.Field, Message: fe.Message})
	}
	if len(req.Reference) > maxReferenceLength {
		errs = append(errs, fieldError{Field: "reference", Message: fmt.Sprintf("must be at most %d bytes", maxReferenceLength)})
	}
	errs = append(errs, checkMetadata(req.Metadata)...)
	if len(errs) > 0 {
		writeValidation(w, errs...)
		return
	}
	s.serveWrite(w, r, KindAuthorize, fingerprint(r, req), authorize(req))
}

func checkMetadata(md map[string]string) []fieldError {
	if len(md) > maxMetadata {
		return []fieldError{{Field: "metadata", Message: fmt.Sprintf("must have at most %d entries", maxMetadata)}}
	}
	for k, v := range md {
		if k == "" || len(k) > maxMetadataText || len(v) > maxMetadataText {
			return []fieldError{{Field: "metadata", Message: fmt.Sprintf("keys must be 1 to %d bytes, values at most %d", maxMetadataText, maxMetadataText)}}
		}
	}
	return nil
}

// amountRequest is the body of capture and refund.
type amountRequest struct {
	AmountMinor int64 `json:"amount_minor"`
}

func (s *Server) handleCapture(w http.ResponseWriter, r *http.Request) {
	req, ok := decodeAmount(w, r)
	if !ok {
		return
	}
	s.serveWrite(w, r, KindCapture, fingerprint(r, req), capture(r.PathValue("id"), req.AmountMinor))
}

func (s *Server) handleRefund(w http.ResponseWriter, r *http.Request) {
	req, ok := decodeAmount(w, r)
	if !ok {
		return
	}
	s.serveWrite(w, r, KindRefund, fingerprint(r, req), refund(r.PathValue("id"), req.AmountMinor))
}

func (s *Server) handleVoid(w http.ResponseWriter, r *http.Request) {
	var req struct{} // no fields: an empty body or {}
	if !decodeWrite(w, r, &req) {
		return
	}
	s.serveWrite(w, r, KindVoid, fingerprint(r, req), void(r.PathValue("id")))
}

func decodeAmount(w http.ResponseWriter, r *http.Request) (amountRequest, bool) {
	var req amountRequest
	if !decodeWrite(w, r, &req) {
		return req, false
	}
	switch {
	case req.AmountMinor < 1:
		writeValidation(w, fieldError{Field: "amount_minor", Message: "must be greater than zero"})
		return req, false
	case req.AmountMinor > money.MaxMinor:
		writeValidation(w, fieldError{Field: "amount_minor", Message: fmt.Sprintf("must be at most %d", money.MaxMinor)})
		return req, false
	}
	return req, true
}

func (s *Server) handleGetAuthorization(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	a, ok := s.merchantLocked(merchantFrom(r.Context())).authorizations[id]
	var snapshot Authorization
	if ok {
		snapshot = *a
	}
	s.mu.Unlock()
	if !ok {
		writeAnswer(w, authorizationNotFound(id), false)
		return
	}
	writeJSON(w, http.StatusOK, snapshot)
}

func (s *Server) handleLookup(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	s.mu.Lock()
	e, ok := s.merchantLocked(merchantFrom(r.Context())).keys[key]
	var res LookupResult
	inProgress := ok && e.stored == nil
	if ok && e.stored != nil {
		res = LookupResult{Key: key, Method: e.method, Path: e.path, Status: e.stored.status, Body: e.stored.body,
			Effects: append([]string{}, e.effects...)}
	}
	s.mu.Unlock()
	switch {
	case inProgress:
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusConflict, CodeRequestInProgress, "the call made with this key is still running")
	case !ok:
		writeProblem(w, http.StatusNotFound, CodeNotFound, "the provider never executed a call with this key")
	default:
		writeJSON(w, http.StatusOK, res)
	}
}

// handleEffects lists the calls executed with a success since the time in ?since= (RFC 3339; all when absent),
// oldest first, each with its authorization as it stands now.
func (s *Server) handleEffects(w http.ResponseWriter, r *http.Request) {
	var since time.Time
	if v := r.URL.Query().Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			writeValidation(w, fieldError{Field: "since", Message: "must be an RFC 3339 time"})
			return
		}
		since = t
	}
	s.mu.Lock()
	m := s.merchantLocked(merchantFrom(r.Context()))
	effects := []Effect{}
	for key, e := range m.keys {
		if e.stored == nil || len(e.effects) == 0 || e.executedAt.Before(since) {
			continue
		}
		authID := e.authID
		if e.kind == KindAuthorize {
			authID = e.effects[0]
		}
		var snapshot Authorization
		if a, ok := m.authorizations[authID]; ok {
			snapshot = *a
		}
		effects = append(effects, Effect{Key: key, Kind: e.kind, AuthorizationID: authID, Status: e.stored.status,
			Body: e.stored.body, Effects: append([]string{}, e.effects...), ExecutedAt: e.executedAt, Authorization: snapshot})
	}
	s.mu.Unlock()
	slices.SortFunc(effects, func(a, b Effect) int { return a.ExecutedAt.Compare(b.ExecutedAt) })
	writeJSON(w, http.StatusOK, map[string][]Effect{"effects": effects})
}

func (s *Server) handleCounters(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	m := s.merchantLocked(merchantFrom(r.Context()))
	counters := make(map[Kind]int64, len(kinds))
	for _, k := range kinds {
		counters[k] = m.counters[k]
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, counters)
}

func (s *Server) handleArmFault(w http.ResponseWriter, r *http.Request) {
	var f Fault
	if !decodeBody(w, r, &f) {
		return
	}
	if fe := f.validate(); fe != nil {
		writeValidation(w, *fe)
		return
	}
	s.mu.Lock()
	s.merchantLocked(merchantFrom(r.Context())).armFault(f)
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleClearFaults(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	clear(s.merchantLocked(merchantFrom(r.Context())).faults)
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleReset(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	// Calls still running finish against the old state, which nobody sees again.
	s.merchants[merchantFrom(r.Context())] = newMerchant()
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func handleNoRoute(w http.ResponseWriter, r *http.Request) {
	writeProblem(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("no route %s %s", r.Method, r.URL.Path))
}

// Authentication.

type merchantKey struct{}

// requireMerchant answers 401 to calls without a bearer secret and puts the
// merchant of the others in the request context.
func requireMerchant(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, secret, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		secret = strings.TrimSpace(secret)
		if !strings.EqualFold(scheme, "Bearer") || secret == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="provider"`)
			writeProblem(w, http.StatusUnauthorized, CodeUnauthorized, "send Authorization: Bearer <secret>; any secret names a sandbox merchant")
			return
		}
		ctx := context.WithValue(r.Context(), merchantKey{}, merchantID(sha256.Sum256([]byte(secret))))
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

func merchantFrom(ctx context.Context) merchantID {
	id, _ := ctx.Value(merchantKey{}).(merchantID)
	return id
}

// Requests.

// decodeWrite checks the Idempotency-Key of a write and decodes its body into
// v. On failure it has answered and reports false; nothing is stored then.
func decodeWrite(w http.ResponseWriter, r *http.Request, v any) bool {
	key, present := r.Header["Idempotency-Key"]
	switch {
	case !present:
		writeProblem(w, http.StatusBadRequest, CodeIdempotencyKeyMissing, "every POST requires an Idempotency-Key header")
		return false
	case !validKey(key[0]):
		writeProblem(w, http.StatusBadRequest, CodeIdempotencyKeyInvalid,
			fmt.Sprintf("Idempotency-Key must be 1 to %d printable ASCII characters", maxKeyLength))
		return false
	}
	return decodeBody(w, r, v)
}

func validKey(k string) bool {
	if k == "" || len(k) > maxKeyLength {
		return false
	}
	for i := range len(k) {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// decodeBody reads one JSON object into v, refusing unknown fields and
// trailing data. An empty body decodes as {}.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeProblem(w, http.StatusBadRequest, CodeInvalidRequest, "the request body could not be read: "+err.Error())
		return false
	}
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	if err := jsondepth.Check(body); err != nil {
		writeProblem(w, http.StatusBadRequest, CodeInvalidRequest, "the body is not a valid JSON request: "+err.Error())
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeProblem(w, http.StatusBadRequest, CodeInvalidRequest, "the body is not a valid JSON request: "+err.Error())
		return false
	}
	if dec.More() {
		writeProblem(w, http.StatusBadRequest, CodeInvalidRequest, "the body holds more than one JSON value")
		return false
	}
	return true
}

// fingerprint identifies a write by method, concrete path and the decoded
// command, re-encoded: key order, spacing and omitted optional fields do not
// make two requests different.
func fingerprint(r *http.Request, cmd any) string {
	b, err := json.Marshal(cmd)
	if err != nil {
		// Commands are plain structs of strings and integers.
		panic(fmt.Sprintf("provider: encoding a command: %v", err))
	}
	return r.Method + " " + r.URL.Path + " " + string(b)
}

// Responses.

// fieldError is one entry of a validation_failed problem.
type fieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// problem is an RFC 9457 problem document.
type problem struct {
	Type   string       `json:"type"`
	Title  string       `json:"title"`
	Status int          `json:"status"`
	Detail string       `json:"detail"`
	Code   string       `json:"code"`
	Errors []fieldError `json:"errors,omitempty"`
}

func jsonAnswer(status int, v any) answer {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("provider: encoding an answer: %v", err))
	}
	return answer{status: status, contentType: "application/json", body: b}
}

func problemAnswer(status int, code, detail string, errs ...fieldError) answer {
	b, err := json.Marshal(problem{
		Type:   "about:blank",
		Title:  http.StatusText(status),
		Status: status,
		Detail: detail,
		Code:   code,
		Errors: errs,
	})
	if err != nil {
		panic(fmt.Sprintf("provider: encoding a problem: %v", err))
	}
	return answer{status: status, contentType: "application/problem+json", body: b}
}

func writeAnswer(w http.ResponseWriter, a answer, replayed bool) {
	h := w.Header()
	h.Set("Content-Type", a.contentType)
	if a.status >= 400 {
		h.Set("Cache-Control", "no-store")
	}
	if replayed {
		h.Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeAnswer(w, jsonAnswer(status, v), false)
}

func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	writeAnswer(w, problemAnswer(status, code, detail), false)
}

func writeValidation(w http.ResponseWriter, errs ...fieldError) {
	writeAnswer(w, problemAnswer(http.StatusUnprocessableEntity, CodeValidationFailed, "the request has invalid values", errs...), false)
}

func writeInternal(w http.ResponseWriter, logger *slog.Logger, err error) {
	logger.Error("internal error", "err", err)
	writeProblem(w, http.StatusInternalServerError, CodeInternal, "internal error")
}

// Logging.

// statusRecorder remembers the status a handler wrote. Unwrap lets
// http.ResponseController reach the connection for the drop fault.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (s *Server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		defer func() {
			// status 0: no answer was written (dropped, or the caller left).
			s.logger.Debug("request", "method", r.Method, "path", r.URL.Path,
				"status", rec.status, "duration", time.Since(start))
		}()
		next.ServeHTTP(rec, r)
	})
}
