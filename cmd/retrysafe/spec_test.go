package main

import (
	"regexp"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/gin-gonic/gin"

	"github.com/retrysafe/retrysafe/api"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/auth"
	"github.com/retrysafe/retrysafe/pkg/idem"
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
	keys, err := auth.ParseKeys(auth.DemoKeys)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(env(map[string]string{"DATABASE_URL": db.DSN}))
	if err != nil {
		t.Fatal(err)
	}
	d := deps{cfg: cfg, db: db.DB, keys: keys, logger: servicetest.Logger(),
		idem: &idem.Handler{DB: db.DB, Store: idem.PostgresStore{}, Logger: servicetest.Logger()}}
	for _, b := range builders {
		s, err := b.build(d)
		if err != nil {
			t.Fatalf("build %s: %v", b.name, err)
		}
		engine, ok := s.handler.(*gin.Engine)
		if !ok {
			t.Fatalf("%s: handler is %T, want *gin.Engine", b.name, s.handler)
		}
		for _, r := range engine.Routes() {
			path := ginParam.ReplaceAllString(r.Path, "{$1}")
			item := doc.Paths.Find(path)
			if item == nil || item.GetOperation(r.Method) == nil {
				t.Errorf("%s serves %s %s, which api/openapi.yaml does not describe", b.name, r.Method, path)
			}
		}
	}
}
