package opstatus

import (
	"net/http"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/httpjson"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/page"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Routes are the operations routes, keyed by ServeMux pattern: GET /v1/operations/{id},
// GET /v1/operations/{id}/timeline and GET /v1/operations?idempotency_key=K. They must be behind
// auth.Middleware: a caller only ever sees its own account's operations, and a request that reaches them with
// no caller is refused (500, logged), never served. A gin router mounts them with httpserver.Mount.
//
//	for pattern, h := range opstatus.Routes(db) {
//		mux.Handle(pattern, auth.Middleware(keys)(h))
//	}
func Routes(db database.Pool) map[string]http.Handler {
	return map[string]http.Handler{
		"GET /v1/operations/{id}": callerRequired(func(w http.ResponseWriter, r *http.Request) {
			if !ids.Valid("op_", r.PathValue("id")) {
				problem.Write(w, r, problem.NotFound("operation"))
				return
			}
			op, err := Get(r.Context(), db, auth.From(r.Context()).AccountID, r.PathValue("id"))
			answer(w, r, op, err)
		}),
		"GET /v1/operations/{id}/timeline": callerRequired(func(w http.ResponseWriter, r *http.Request) {
			tl, err := GetTimeline(r.Context(), db, auth.From(r.Context()).AccountID, r.PathValue("id"))
			answer(w, r, tl, err)
		}),
		"GET /v1/operations": callerRequired(func(w http.ResponseWriter, r *http.Request) {
			q := r.URL.Query()
			key := q.Get("idempotency_key")
			if msg := checkKey(key); msg != "" {
				problem.Write(w, r, problem.Validation(problem.FieldError{Field: "idempotency_key", Message: msg}))
				return
			}
			p, err := page.FromQuery(q)
			if err != nil {
				problem.Write(w, r, err)
				return
			}
			ops, err := FindByKeyPage(r.Context(), db, auth.From(r.Context()).AccountID, key, p)
			answer(w, r, page.Of(ops, p, func(op Operation) page.Cursor { return page.Cursor{At: op.CreatedAt, ID: op.ID} }), err)
		}),
	}
}

// callerRequired refuses a request that reached the routes without auth.Middleware's principal.
func callerRequired(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := auth.Lookup(r.Context()); !ok {
			problem.Write(w, r, problem.New("internal", "the server could not tell who sent this request"))
			return
		}
		h(w, r)
	})
}

// answer writes v as 200 JSON, or err as a problem.
func answer(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err != nil {
		problem.Write(w, r, err)
		return
	}
	httpjson.Write(w, r, http.StatusOK, v)
}

// checkKey holds a looked-up key to the rules of the Idempotency-Key header (pkg/idem.ParseKey, which this
// package cannot import): a value no write could have used is refused rather than looked up.
func checkKey(key string) string {
	if key == "" {
		return "is required"
	}
	if len(key) > 255 {
		return "must be 1 to 255 printable ASCII characters"
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return "must be 1 to 255 printable ASCII characters"
		}
	}
	return ""
}
