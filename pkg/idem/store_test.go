package idem_test

import (
	"testing"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/idem"
	"github.com/retrysafe/retrysafe/pkg/idem/idemtest"
)

func TestPostgresStore(t *testing.T) {
	t.Parallel()
	idemtest.Exercise(t, func(t *testing.T) (idem.Store, *gorm.DB) {
		return idem.PostgresStore{}, testdb.Schema(t).DB
	})
}
