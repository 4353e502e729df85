package idem

import (
	"context"
	"net/http"
	"strings"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Handle is Run for a net/http handler: the Call comes from r (its ServeMux pattern and path values, its
// headers, the caller WithCaller put in its context) and the answer is written on w.
func (h *Handler) Handle(w http.ResponseWriter, r *http.Request, req Request, write WriteFunc) {
	call := HTTPCall(r)
	w.Header().Set(ids.HeaderAttemptID, call.AttemptID)
	WriteAnswer(w, r, h.Run(r.Context(), call, req, write))
}

// HandleExternal is RunExternal for a net/http handler, as Handle.
func HandleExternal[T any](h *Handler, w http.ResponseWriter, r *http.Request, req Request, steps ExternalSteps[T]) {
	call := HTTPCall(r)
	w.Header().Set(ids.HeaderAttemptID, call.AttemptID)
	WriteAnswer(w, r, RunExternal(r.Context(), h, call, req, steps))
}

type callerKey struct{}

// WithCaller returns ctx carrying the caller of the request, for HTTPCall: the service's authentication
// middleware sets it.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller WithCaller put in ctx.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// HTTPCall is the Call of r, routed by a net/http ServeMux (Go 1.22 patterns): the route is r.Pattern without its
// method, the parameters its wildcards' values, the attempt its valid Attempt-Id header or a new one. The caller
// is auth.Middleware's principal or, for a service with its own authentication, the one WithCaller put in the
// request's context, as idemgin.Call has it.
func HTTPCall(r *http.Request) Call {
	caller, _ := CallerFrom(r.Context())
	if p, ok := auth.Lookup(r.Context()); ok {
		caller = Caller{AccountID: p.AccountID, Actor: p.Actor()}
	}
	route := r.Pattern
	if _, path, ok := strings.Cut(route, " "); ok {
		route = path
	}
	params := map[string]string{}
	for segment := range strings.SplitSeq(route, "/") { // a wildcard is a whole segment: {name}, {name...} or {$}
		if name, ok := strings.CutPrefix(segment, "{"); ok && name != "$}" {
			name = strings.TrimSuffix(strings.TrimSuffix(name, "}"), "...")
			params[name] = r.PathValue(name)
		}
	}
	return Call{Method: r.Method, Route: route, Params: params, Header: r.Header, Caller: caller,
		AttemptID: ids.AttemptID(r)}
}

// WriteAnswer writes a on w; a problem goes through problem.Write.
func WriteAnswer(w http.ResponseWriter, r *http.Request, a Answer) {
	for name, values := range a.Header {
		w.Header()[name] = values
	}
	if a.Err != nil {
		problem.Write(w, r, a.Err)
		return
	}
	w.WriteHeader(a.Status)
	_, _ = w.Write(a.Body)
}
