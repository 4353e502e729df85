package idem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
)

// TestNetHTTPAdapter: the core behind a plain net/http ServeMux. The route's path value is part of the
// fingerprint (one key on two things is a conflict), a retry is replayed byte for byte, the attempt id is echoed,
// and a request whose caller was never named is refused with a problem, storing nothing.
func TestNetHTTPAdapter(t *testing.T) {
	t.Parallel()
	env := servicetest.New(t, servicetest.GormDefaults())
	h := env.Idem
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/things/{id}/marks", func(w http.ResponseWriter, r *http.Request) {
		h.Handle(w, r, idem.Request{Kind: "things.mark", Command: map[string]any{}},
			func(ctx context.Context, tx *gorm.DB, op opstatus.Operation) (idem.Result, error) {
				return idem.Result{Status: http.StatusCreated, Body: map[string]string{"thing": r.PathValue("id"), "op": op.ID}}, nil
			})
	})
	mux.HandleFunc("POST /v1/sends", func(w http.ResponseWriter, r *http.Request) {
		idem.HandleExternal(h, w, r, idem.Request{Kind: "things.send", Command: map[string]any{}}, idem.ExternalSteps[string]{
			Call: func(ctx context.Context, op opstatus.Operation) (string, error) { return "sent-" + op.ID, nil },
			Record: func(ctx context.Context, tx *gorm.DB, op opstatus.Operation, ref string, callErr error) (idem.Result, error) {
				return idem.Result{Status: http.StatusCreated, Body: map[string]string{"ref": ref}}, callErr
			},
		})
	})
	named := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r.WithContext(idem.WithCaller(r.Context(), idem.Caller{AccountID: "acct_http", Actor: "agent:http"})))
	}))
	t.Cleanup(named.Close)
	anonymous := httptest.NewServer(mux)
	t.Cleanup(anonymous.Close)

	attempts := 0
	send := func(base, path, key string) answer {
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", key)
		attempts++ // an attempt id names one attempt: a retry sends its own
		req.Header.Set("Attempt-Id", fmt.Sprintf("att_http_%s%s_%d", key, path[len(path)-2:], attempts))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return answer{err: err}
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return answer{status: resp.StatusCode, header: resp.Header, body: string(body), err: err}
	}
	first := send(named.URL, "/v1/things/a/marks", "k1")
	again := send(named.URL, "/v1/things/a/marks", "k1")
	other := send(named.URL, "/v1/things/b/marks", "k1")
	if first.status != http.StatusCreated || first.header.Get("Attempt-Id") != "att_http_k1ks_1" {
		t.Fatalf("first: %d %v %s", first.status, first.header, first.body)
	}
	if again.status != http.StatusCreated || again.body != first.body || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %v %s; want the first answer replayed", again.status, again.header, again.body)
	}
	if other.status != http.StatusUnprocessableEntity || !strings.Contains(other.body, "idempotency_key_reused") {
		t.Fatalf("same key on another thing: %d %s; want 422 idempotency_key_reused", other.status, other.body)
	}
	ext, extAgain := send(named.URL, "/v1/sends", "k2"), send(named.URL, "/v1/sends", "k2")
	if ext.status != http.StatusCreated || extAgain.body != ext.body || extAgain.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("external: %d %s, then %d %s", ext.status, ext.body, extAgain.status, extAgain.body)
	}
	anon := send(anonymous.URL, "/v1/things/a/marks", "k3")
	if anon.status != http.StatusInternalServerError || !strings.Contains(anon.body, `"code":"internal"`) {
		t.Fatalf("no caller: %d %s; want a 500 problem", anon.status, anon.body)
	}
	var ops int64
	env.DB.Raw(`SELECT count(*) FROM operations`).Scan(&ops)
	if ops != 2 {
		t.Fatalf("%d operations; want 2 (the mark and the send, nothing for the refusals)", ops)
	}
}
