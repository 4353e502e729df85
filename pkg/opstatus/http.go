package opstatus

import (
	"encoding/json"
	"net/http"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/ids"
	"github.com/retrysafe/retrysafe/pkg/page"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Handler serves GET /v1/operations/{id}, GET /v1/operations/{id}/timeline and
// GET /v1/operations?idempotency_key=K. It must be behind auth.Middleware: a caller only ever sees its own
// account's operations, and a request that reaches it with no caller is refused (500, logged), never served.
// A gin router mounts it with opstatusgin.Routes.
//
//	mux.Handle("/v1/operations", auth.Middleware(keys)(opstatus.Handler(db)))
//	mux.Handle("/v1/operations/", auth.Middleware(keys)(opstatus.Handler(db)))
func Handler(db *gorm.DB) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/operations/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !ids.Valid("op_", r.PathValue("id")) {
			problem.Write(w, r, problem.NotFound("operation"))
			return
		}
		op, err := Get(r.Context(), db, auth.From(r.Context()).AccountID, r.PathValue("id"))
		writeJSON(w, r, op, err)
	})
	mux.HandleFunc("GET /v1/operations/{id}/timeline", func(w http.ResponseWriter, r *http.Request) {
		tl, err := GetTimeline(r.Context(), db, auth.From(r.Context()).AccountID, r.PathValue("id"))
		writeJSON(w, r, tl, err)
	})
	mux.HandleFunc("GET /v1/operations", func(w http.ResponseWriter, r *http.Request) {
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
		writeJSON(w, r, page.Of(ops, p, func(op Operation) page.Cursor { return page.Cursor{At: op.CreatedAt, ID: op.ID} }), err)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := auth.Lookup(r.Context()); !ok {
			problem.Write(w, r, problem.New("internal", "the server could not tell who sent this request"))
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// writeJSON answers v as 200 application/json, or err as a problem.
func writeJSON(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err != nil {
		problem.Write(w, r, err)
		return
	}
	body, err := json.Marshal(v)
	if err != nil {
		problem.Write(w, r, err)
		return
	}
	w.Header()["Content-Type"] = []string{"application/json"}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
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
