package conformancetest_test

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/proctest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/conformance"
	"github.com/retrysafe/retrysafe/services/deploys"
	"github.com/retrysafe/retrysafe/services/payments"
	"github.com/retrysafe/retrysafe/services/provider"
	"github.com/retrysafe/retrysafe/services/tickets"
)

// TestServicesConform: every case conformance can check passes against each write, counted at its real effect
// (tickets listed by source event, provider counters, deploy rows). Case 3's new caller is a new process, the
// retrysafe binary run as `conformance --resume`. Case 7 needs a kill hook: TestTicketsWorkerKilled.
func TestServicesConform(t *testing.T) {
	bin := proctest.Build(t)
	prov := proctest.Start(t, bin, []string{"provider"}, nil, "PROVIDER_ADDR")
	provURL, err := url.Parse(prov.URL)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		file  string
		start func(t *testing.T, o *conformance.Options, secrets map[string]string)
	}{
		{"tickets.json", startTickets},
		{"payment-intent.json", startPayments(prov.URL)},
		{"capture.json", startPayments(prov.URL)},
		{"refund.json", startPayments(prov.URL)},
		{"deploys.json", startDeploys},
	}
	for _, tt := range tests {
		t.Run(strings.TrimSuffix(tt.file, ".json"), func(t *testing.T) {
			spec, err := conformance.LoadSpec("../../examples/conformance/" + tt.file)
			if err != nil {
				t.Fatal(err)
			}
			secrets := map[string]string{"RETRYSAFE_TOKEN": servicetest.AgentSecret}
			opts := conformance.Options{
				Allow:          []string{provURL.Host},
				RestartCommand: []string{bin, "conformance", "--resume"},
				Getenv: func(name string) string {
					if name == "PROVIDER_URL" { // the payment files count at the sandbox wherever it runs
						return prov.URL
					}
					return secrets[name]
				},
			}
			tt.start(t, &opts, secrets)
			rep := run(t, spec, opts, secrets)
			for n, v := range rep.Verdicts() {
				want := conformance.Pass
				if n == conformance.CaseKilledWorker {
					want = conformance.NotChecked
				}
				if v != want {
					t.Errorf("case %d: %s; want %s", n, v, want)
				}
			}
			if len(rep.Results) != 7 || !rep.Passed() {
				t.Errorf("report: %d cases, passed %v; want 7, true", len(rep.Results), rep.Passed())
			}
		})
	}
}

// run runs conformance and logs its table and JUnit XML, which must not show any secret.
func run(t *testing.T, spec conformance.Spec, opts conformance.Options, secrets map[string]string) *conformance.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := conformance.Run(ctx, spec, opts)
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
	for name, secret := range secrets {
		if strings.Contains(out.String(), secret) {
			t.Errorf("the report shows the value of %s", name)
		}
	}
	return rep
}

func startTickets(t *testing.T, o *conformance.Options, _ map[string]string) {
	env := servicetest.New(t)
	svc, err := tickets.New(env.Deps, tickets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	env.Serve(t, svc)
	o.Target = env.URL
}

// startPayments serves payments as its own merchant at the provider sandbox, so the counters are this test's.
func startPayments(providerURL string) func(t *testing.T, o *conformance.Options, secrets map[string]string) {
	return func(t *testing.T, o *conformance.Options, secrets map[string]string) {
		env := servicetest.New(t)
		merchant := "sk_test_" + strings.ReplaceAll(t.Name(), "/", "_")
		secrets["PROVIDER_SECRET"] = merchant
		client := provider.NewClientHTTP(providerURL, merchant, apitest.HTTPClient(t, 2*time.Second))
		svc, err := payments.New(env.Deps, payments.Config{
			Provider: client, ApprovalThresholds: map[string]int64{"USD": 100000}, ApprovalTTL: time.Hour,
		})
		if err != nil {
			t.Fatal(err)
		}
		env.Serve(t, svc)
		o.Target = env.URL
	}
}

// startDeploys serves deploys (no controller: the effect counted is the deploy row, made by the write itself).
// The request file counts rows with psql, which gets the schema through DATABASE_URL.
func startDeploys(t *testing.T, o *conformance.Options, _ map[string]string) {
	env := servicetest.New(t)
	svc, err := deploys.New(env.Deps, deploys.Config{
		ApprovalEnvironments: []string{"production"}, ApprovalTTL: time.Hour,
		Steps: 2, StepDuration: 20 * time.Millisecond, LockLease: 5 * time.Second, Heartbeat: 10 * time.Millisecond,
		PollInterval: 10 * time.Millisecond, Workers: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	env.Serve(t, svc)
	o.Target = env.URL
	o.Env = append(o.Env, "DATABASE_URL="+libpqURL(t, env.DB))
}

// libpqURL is the schema's URL in the form psql reads: search_path as a server option.
func libpqURL(t *testing.T, db *testdb.DB) string {
	u, err := url.Parse(testdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("options", fmt.Sprintf("-csearch_path=%s", db.Schema))
	u.RawQuery = q.Encode()
	return u.String()
}
