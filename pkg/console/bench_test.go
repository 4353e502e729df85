package console_test

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/internal/servicetest"
)

var nextLink = regexp.MustCompile(`href="(/console/operations\?after=[^"]+)" id="next"`)

// BenchmarkOperationsPages renders the operations list of an account holding 10,000 operations: the first page,
// a page deep in the list (reached through 40 next links) and a filtered page. The list is keyset-paginated on
// operations_account_listing, so every page costs about what the first does; the plan is checked to use it.
//
//	go test -run '^$' -bench OperationsPages -benchtime 200x ./pkg/console/
func BenchmarkOperationsPages(b *testing.B) {
	env := servicetest.New(b)
	env.Serve(b, servicetest.Routes(func(gin.IRouter) {}))
	err := env.DB.Exec(`
INSERT INTO operations (id, account_id, kind, state, idempotency_key, created_at, updated_at)
SELECT 'op_bench_' || i, 'acct_demo', (ARRAY['tickets.create', 'payments.capture', 'deploys.create'])[1 + i % 3],
       CASE WHEN i % 100 = 0 THEN 'unknown' WHEN i % 7 = 0 THEN 'failed' ELSE 'succeeded' END,
       'key-' || i, now() - make_interval(secs => 10000 - i), now()
FROM generate_series(1, 10000) AS i;
INSERT INTO operations (id, account_id, kind, state, idempotency_key)
SELECT 'op_other_' || i, 'acct_other', 'tickets.create', 'succeeded', 'key-' || i FROM generate_series(1, 10000) AS i;
ANALYZE operations`).Error
	if err != nil {
		b.Fatal(err)
	}
	var plan []string
	env.DB.Raw(`EXPLAIN SELECT id FROM operations WHERE account_id = 'acct_demo'
ORDER BY unknown DESC, created_at DESC, id DESC LIMIT 51`).Scan(&plan)
	if !strings.Contains(strings.Join(plan, "\n"), "operations_account_listing") {
		b.Fatalf("the operations list does not use its index:\n%s", strings.Join(plan, "\n"))
	}

	p := newPerson(b, env.URL)
	p.signIn(servicetest.ApproverSecret)
	get := func(path string) string {
		res, page := p.do(http.MethodGet, path, nil)
		if res.StatusCode != http.StatusOK || res.Request.URL.Path != "/console/operations" {
			b.Fatalf("GET %s = %d at %s", path, res.StatusCode, res.Request.URL)
		}
		return page
	}
	deep := "/console/operations"
	for range 40 {
		m := nextLink.FindStringSubmatch(get(deep))
		if m == nil {
			b.Fatal("no next link")
		}
		deep = strings.ReplaceAll(m[1], "&amp;", "&")
	}
	for _, bm := range []struct{ name, path string }{
		{"FirstPage", "/console/operations"},
		{"Page41", deep},
		{"FailedPaymentCaptures", "/console/operations?" + url.Values{"state": {"failed"}, "kind": {"payments.capture"}}.Encode()},
		{"SearchByKey", "/console/operations?q=key-5000"},
	} {
		b.Run(bm.name, func(b *testing.B) {
			for b.Loop() {
				get(bm.path)
			}
		})
	}
}
