package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/conformance"
)

// TestConformance runs retrysafe conformance, with examples/conformance/orders.json, against this example on a
// test schema: it fails case 4 only. Without a kill hook case 7 is not checked. The server holds its own pool,
// opened as main opens it, so case 2's 50 copies meet its bound; none of them may end in a logged error.
func TestConformance(t *testing.T) {
	db := testdb.Schema(t)
	if err := migrate(db.DB); err != nil {
		t.Fatal(err)
	}
	own, err := open(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, err := own.DB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sqlDB.Close() })
	if got := sqlDB.Stats().MaxOpenConnections; got != maxConns {
		t.Errorf("the pool allows %d connections (0: unbounded); want %d", got, maxConns)
	}
	var logs syncBuffer
	const token = "shop-token-never-printed"
	srv := httptest.NewServer(newServer(own, token, slog.New(slog.NewJSONHandler(&logs, nil))))
	t.Cleanup(srv.Close)

	spec, err := conformance.LoadSpec("../conformance/orders.json")
	if err != nil {
		t.Fatal(err)
	}
	getenv := func(name string) string {
		if name == "SHOP_TOKEN" {
			return token
		}
		return ""
	}
	rep, err := conformance.Run(context.Background(), spec, conformance.Options{Target: srv.URL, Getenv: getenv})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteJUnit(&out); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	if strings.Contains(out.String(), token) {
		t.Errorf("the report prints the secret")
	}
	want := map[int]conformance.Verdict{
		conformance.CaseLostResponse: conformance.Pass, conformance.CaseConcurrentCopies: conformance.Pass, conformance.CaseRestartedCaller: conformance.Pass,
		conformance.CaseChangedPayload: conformance.Fail, conformance.CaseEquivalentJSON: conformance.Pass, conformance.CaseMissingKeys: conformance.Pass,
		conformance.CaseKilledWorker: conformance.NotChecked,
	}
	for n, v := range want {
		if got := rep.Verdicts()[n]; got != v {
			t.Errorf("case %d: verdict %q; want %q", n, got, v)
		}
	}
	if rep.Passed() {
		t.Errorf("Passed() = true; want false")
	}

	// The effect behind case 2's verdict, read from the table itself.
	var dup []string
	if err := db.Raw(`SELECT customer FROM nofp_orders GROUP BY customer HAVING count(*) > 1`).Scan(&dup).Error; err != nil {
		t.Fatal(err)
	}
	if len(dup) != 0 {
		t.Errorf("customers with two orders: %v; want none", dup)
	}
	if logs.String() != "" {
		t.Errorf("errors logged during the run:\n%s", logs.String())
	}
}

// TestInternalErrorsAreLogged: a write or a list the database refuses (here its tables do not exist) is a 500
// with only a code for the client, and a log line with the cause for the operator.
func TestInternalErrorsAreLogged(t *testing.T) {
	dsn, err := url.Parse(testdb.Schema(t).DSN)
	if err != nil {
		t.Fatal(err)
	}
	q := dsn.Query()
	q.Set("search_path", "nofp_no_such_schema")
	dsn.RawQuery = q.Encode()
	db, err := open(dsn.String())
	if err != nil {
		t.Fatal(err)
	}
	if sqlDB, err := db.DB(); err == nil {
		t.Cleanup(func() { sqlDB.Close() })
	}
	var logs syncBuffer
	srv := httptest.NewServer(newServer(db, "", slog.New(slog.NewJSONHandler(&logs, nil))))
	t.Cleanup(srv.Close)

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders", strings.NewReader(`{"customer":"c1","sku":"s1","quantity":1}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "k1")
	req.Header.Set("Content-Type", "application/json")
	for _, tc := range []struct {
		req      *http.Request
		msg      string
		mentions string
	}{
		{req, `"msg":"order not written"`, `nofp_keys`},
		{httptest.NewRequest(http.MethodGet, srv.URL+"/v1/orders?customer=c1", nil), `"msg":"orders not listed"`, `nofp_orders`},
	} {
		tc.req.RequestURI = ""
		resp, err := http.DefaultClient.Do(tc.req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusInternalServerError || string(body) != `{"code":"internal"}` {
			t.Errorf("%s %s: %d %s; want 500 {\"code\":\"internal\"}", tc.req.Method, tc.req.URL.Path, resp.StatusCode, body)
		}
		line := logs.lineWith(tc.msg)
		if line == "" || !strings.Contains(line, tc.mentions) || !strings.Contains(line, `"level":"ERROR"`) {
			t.Errorf("no error line %s naming %s; the log:\n%s", tc.msg, tc.mentions, logs.String())
		}
	}
}

// syncBuffer is a log destination that concurrent handlers may write to.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// lineWith is the first line that contains s, or "".
func (b *syncBuffer) lineWith(s string) string {
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}
