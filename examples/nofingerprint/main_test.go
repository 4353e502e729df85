package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/conformance"
)

// TestConformance runs retrysafe conformance, with examples/conformance/orders.json, against this example on a
// test schema: it fails case 4 only. Without a kill hook case 7 is not checked.
func TestConformance(t *testing.T) {
	db := testdb.Schema(t)
	if err := migrate(db.DB); err != nil {
		t.Fatal(err)
	}
	const token = "shop-token-never-printed"
	srv := httptest.NewServer(newServer(db.DB, token))
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
}
