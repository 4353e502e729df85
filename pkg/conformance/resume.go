package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/retrysafe/retrysafe/pkg/jsondepth"
)

// callerState is what a caller stores before it sends a write, so that after a restart it can retry with the
// same key. Path is filled and escaped, as sent; header values are kept as the file wrote them, with their
// ${NAME} references (secrets are never written to the file) and their {{name}} placeholders, filled from Vars
// by the new caller in the same single pass as the first: a saved value is never read as a reference.
type callerState struct {
	Target    string            `json:"target"`
	Method    string            `json:"method"`
	Path      string            `json:"path"`
	Headers   map[string]string `json:"headers"`
	Vars      map[string]string `json:"vars"`
	KeyHeader string            `json:"key_header"`
	Key       string            `json:"key"`
	Body      json.RawMessage   `json:"body"`
	// TimeoutMS and SettleMS are the first caller's bounds, kept by the new one.
	TimeoutMS int64 `json:"timeout_ms"`
	SettleMS  int64 `json:"settle_ms"`
}

// resumed is the answer a new caller process prints, one JSON line.
type resumed struct {
	Status    int         `json:"status,omitempty"`
	Header    http.Header `json:"header,omitempty"`
	Body      []byte      `json:"body,omitempty"`
	ElapsedMS int64       `json:"elapsed_ms,omitempty"`
	Error     string      `json:"error,omitempty"`
}

// saveState writes the caller's state file (mode 0600, in a new temporary directory) for case 3.
func (r *runner) saveState(c *caseRun, key string, body []byte) (string, func(), error) {
	u, err := fillURL(&url.URL{}, r.spec.Path, c.vars)
	if err != nil {
		return "", nil, err
	}
	path := u.EscapedPath()
	if u.RawQuery != "" {
		path += "?" + u.RawQuery
	}
	for _, v := range r.spec.Headers {
		if _, err := expandHeader(v, c.vars, func(string) string { return "" }); err != nil {
			return "", nil, err
		}
	}
	st := callerState{
		Target: r.target.String(), Method: r.spec.Method, Path: path, Headers: r.spec.Headers, Vars: c.vars,
		KeyHeader: r.spec.KeyHeader, Key: key, Body: body,
		TimeoutMS: r.opts.RequestTimeout.Milliseconds(), SettleMS: r.opts.SettleTimeout.Milliseconds(),
	}
	data, err := json.Marshal(st)
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "retrysafe-conformance-")
	if err != nil {
		return "", nil, err
	}
	file := filepath.Join(dir, "caller.json")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return file, func() { os.RemoveAll(dir) }, nil
}

// Resume is the new caller process of case 3: it reads the state file a previous caller stored, retries that
// write with the same key against the same target (and nothing else) until it gets an answer other than
// in-progress, within settle, and prints the answer as one JSON line on out. `retrysafe conformance --resume
// FILE` calls it.
func Resume(ctx context.Context, stateFile string, getenv func(string) string, out io.Writer) error {
	a, err := resume(ctx, stateFile, getenv)
	res := resumed{Status: a.status, Header: a.header, Body: a.body, ElapsedMS: a.elapsed.Milliseconds()}
	if err != nil {
		res = resumed{Error: err.Error()}
	}
	return json.NewEncoder(out).Encode(res)
}

func resume(ctx context.Context, stateFile string, getenv func(string) string) (response, error) {
	data, err := os.ReadFile(stateFile)
	if err != nil {
		return response{}, err
	}
	if err := jsondepth.Check(data); err != nil {
		return response{}, fmt.Errorf("state file: %w", err)
	}
	var st callerState
	if err := json.Unmarshal(data, &st); err != nil {
		return response{}, fmt.Errorf("state file: %w", err)
	}
	spec := Spec{
		Method: st.Method, Path: st.Path, Headers: st.Headers, KeyHeader: st.KeyHeader,
		Body: st.Body, Variant: json.RawMessage(`{"conformance":"resume"}`),
	}
	if err := spec.check(); err != nil {
		return response{}, fmt.Errorf("state file: %w", err)
	}
	// A fresh runner: its own HTTP client and transport, no connection or state shared with the first caller.
	r, err := newRunner(spec, Options{
		Target: st.Target, Getenv: getenv,
		RequestTimeout: time.Duration(st.TimeoutMS) * time.Millisecond, SettleTimeout: time.Duration(st.SettleMS) * time.Millisecond,
		Counter: func(context.Context, map[string]string) (int64, error) { return 0, nil },
	})
	if err != nil {
		return response{}, err
	}
	defer r.close()
	c := &caseRun{n: CaseRestartedCaller, vars: st.Vars}
	a, _ := r.settle(ctx, c, st.Key, st.Body)
	if a.err != nil {
		return a, a.err
	}
	return a, nil
}
