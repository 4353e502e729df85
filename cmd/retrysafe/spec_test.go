package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/retrysafe/retrysafe/api"
	"github.com/retrysafe/retrysafe/internal/service"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/console"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/metrics"
)

var ginParam = regexp.MustCompile(`:([A-Za-z_]+)`)

// TestEveryRouteIsInTheSpec builds every service the way serve does and checks that each route it registers is
// described in api/openapi.yaml, so an OpenAPI client can call everything the services serve.
func TestEveryRouteIsInTheSpec(t *testing.T) {
	t.Parallel()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(api.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("api/openapi.yaml is not valid OpenAPI: %v", err)
	}
	db := testdb.Schema(t)
	cfg, err := loadConfig(env(map[string]string{"DATABASE_URL": db.DSN}))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := database.PoolOf(db.DB)
	if err != nil {
		t.Fatal(err)
	}
	d := service.Deps{DB: db.DB, Pool: pool, Logger: servicetest.Logger(), Metrics: metrics.New(),
		Idem: &idem.Handler{DB: db.DB, Logger: servicetest.Logger()}}
	stack, err := httpStack(cfg, db.DB)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range builders {
		s, err := b.build(cfg, d)
		if err != nil {
			t.Fatalf("build %s: %v", b.name, err)
		}
		engine := service.Handler(d, stack, s)
		for _, r := range engine.Routes() {
			if strings.HasPrefix(r.Path, console.Prefix) {
				continue // the browser console's HTML pages (README, "Console"), not the JSON API
			}
			path := ginParam.ReplaceAllString(r.Path, "{$1}")
			item := doc.Paths.Find(path)
			if item == nil || item.GetOperation(r.Method) == nil {
				t.Errorf("%s serves %s %s, which api/openapi.yaml does not describe", b.name, r.Method, path)
			}
		}
	}
}
