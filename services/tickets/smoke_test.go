package tickets_test

import (
	"testing"

	"github.com/retrysafe/retrysafe/internal/apitest"
	"github.com/retrysafe/retrysafe/internal/servicetest"
	"github.com/retrysafe/retrysafe/services/tickets"
)

func TestSmoke(t *testing.T) {
	env := servicetest.New(t)
	tickets.Routes(env.API, &tickets.Server{DB: env.DB.DB, Store: tickets.PostgresStore{}, Idem: env.Idem})
	c := env.Start(t)
	c.Post("/v1/tickets", `{"project":"ops","title":"x"}`, apitest.Key("k")).Status(t, 201)
	c.Post("/v1/tickets", `{"title":"x","project":"ops"}`, apitest.Key("k")).Status(t, 201)
	c.Post("/v1/tickets", `{"title":"y","project":"ops"}`, apitest.Key("k")).Status(t, 422)
}
