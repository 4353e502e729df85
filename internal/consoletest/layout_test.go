package consoletest_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/consoletest"
	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/services/deploys"
	"github.com/retrysafe/retrysafe/services/tickets"
)

// TestOneConsoleAt1280 serves tickets and deploys as `serve all` does, and reads the console of the tickets port
// in a 1280 px wide window: it names both services, labels each operation with its own service, and serves
// deploys' environments. The environments table, with a deploy holding the lock, fits: no card scrolls
// sideways (its last column, Lease until, would be cut off) and every id stays on one line.
func TestOneConsoleAt1280(t *testing.T) {
	t.Parallel()
	tab := person(t)
	env := servicetest.New(t)
	tk, err := tickets.New(env.Deps, tickets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	dp, err := deploys.New(env.Deps, deploys.Config{
		ApprovalEnvironments: []string{"production"}, ApprovalTTL: time.Hour,
		Steps: 1, StepDuration: 3 * time.Second, LockLease: 5 * time.Second, Heartbeat: 100 * time.Millisecond,
		PollInterval: 10 * time.Millisecond, Workers: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	env.RunWorkers(t, service.Background{}, dp)
	h := service.HTTP{ConsoleServices: []service.Service{tk, dp}}
	deployer := env.ServeHTTP(t, h, dp)
	ticketer := env.ServeHTTP(t, h, tk)
	base := env.URL // the tickets port

	ticketer.Post("/v1/tickets", `{"project":"ops","title":"one console"}`, apitest.Key("t-1")).Status(t, http.StatusCreated)
	// Staging runs version 1 and, while the test reads the page, deploys version 2 under its lock.
	const staging = "staging-eu-west-1"
	deploy := func(n int) {
		deployer.Post("/v1/deploys", fmt.Sprintf(`{"service":"api","environment":%q,"artifact":%q,"expected_environment_version":%d}`,
			staging, artifact(n), n-1), apitest.Key(fmt.Sprintf("d-%d", n))).Status(t, http.StatusAccepted)
	}
	deploy(1)
	servicetest.Eventually(t, "staging at version 1", func() bool {
		return deployer.Get("/v1/environments/"+staging).Status(t, http.StatusOK).JSON(t)["version"] == float64(1)
	})
	deploy(2)

	signIn(t, tab, base, servicetest.ApproverSecret)
	if brand := consoletest.Get(t, tab, chromedp.Evaluate[string](`document.querySelector('.brand').innerText`)); brand != "retrysafe · tickets · deploys" {
		t.Errorf("console header %q; want one console naming both services", brand)
	}
	page(t, tab, base, "/console/operations")
	rows := consoletest.Get(t, tab, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('#operations tbody tr')).map(r => r.cells[0].innerText + ' ' + r.cells[2].innerText)`))
	if strings.Join(rows, ",") != "deploys deploys.create,deploys deploys.create,tickets tickets.create" {
		t.Errorf("operations listed as %q; want each labelled with its own service", rows)
	}

	servicetest.Eventually(t, "the deploy holding staging's lock", func() bool {
		return strings.Contains(page(t, tab, base, "/console/environments"), "left)")
	})
	consoletest.Screenshot(t, tab, "environments")
	if width := consoletest.Get(t, tab, chromedp.Evaluate[int](`window.innerWidth`)); width != 1280 {
		t.Fatalf("window is %d px wide; want 1280", width)
	}
	cut := consoletest.Get(t, tab, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('.card, body')).filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.tagName + ' ' + e.scrollWidth + '>' + e.clientWidth)`))
	if len(cut) > 0 {
		t.Errorf("parts wider than the window at 1280 px (cut off, or scrolled sideways): %v", cut)
	}
	// The cells of the id columns, and how many lines each takes.
	lines := consoletest.Get(t, tab, chromedp.Evaluate[[]int](`Array.from(document.querySelectorAll('table')).flatMap(table => {
		const heads = Array.from(table.querySelectorAll('th')).map(th => th.innerText);
		const cols = ['Current deploy', 'Lock holder'].map(name => heads.indexOf(name)).filter(i => i >= 0);
		return Array.from(table.querySelectorAll('tbody tr')).flatMap(tr => cols.map(i => {
			const r = document.createRange(); r.selectNodeContents(tr.cells[i]);
			return new Set(Array.from(r.getClientRects()).map(x => Math.round(x.top))).size;
		}));
	})`))
	if len(lines) < 2 {
		t.Fatalf("%d id cells in the environments table; want the current deploy and the lock holder", len(lines))
	}
	for _, n := range lines {
		if n != 1 {
			t.Errorf("an id takes %d lines at 1280 px (all: %v); want each on one", n, lines)
			break
		}
	}
	lease := consoletest.Get(t, tab, chromedp.Evaluate[bool](`(() => {
		const th = Array.from(document.querySelectorAll('th')).find(th => th.innerText === 'Lease until');
		return !!th && th.getBoundingClientRect().right <= document.querySelector('.card').getBoundingClientRect().right;
	})()`))
	if !lease {
		t.Error("the Lease until column is not inside its card at 1280 px")
	}
}
