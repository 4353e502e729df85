package idem_test

import (
	"regexp"
	"strings"
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

// TestLookupPlanReadsOneOperation checks the plan PostgreSQL keeps for Lookup's prepared statement (the generic
// plan, made once per connection, here while the tables are nearly empty, as after a deploy on a new database):
// it must reach the key's operation by its whole primary key, never scan the account's operations and filter
// them, which made every retry read all of an account's operations.
func TestLookupPlanReadsOneOperation(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	var plan []string
	err := db.Connection(func(conn *gorm.DB) error {
		if err := conn.Exec(`SET plan_cache_mode = force_generic_plan`).Error; err != nil {
			return err
		}
		defer conn.Exec(`RESET plan_cache_mode`)
		if err := conn.Exec(`PREPARE lookup_plan (text, text) AS ` + idem.LookupSQL).Error; err != nil {
			return err
		}
		defer conn.Exec(`DEALLOCATE lookup_plan`)
		return conn.Raw(`EXPLAIN EXECUTE lookup_plan('acct_a', 'k')`).Scan(&plan).Error
	})
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if !regexp.MustCompile(`on operations o [^\n]*\n\s*Index Cond: \(\(account_id = k\.account_id\) AND \(id = k\.operation_id\)\)`).MatchString(text) ||
		strings.Contains(text, "Filter") {
		t.Fatalf("Lookup's generic plan does not read the operation by its primary key:\n%s", text)
	}
}
