package opstore_test

import (
	"regexp"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// TestLookupPlanReadsOneOperation checks the plan PostgreSQL keeps for the key's read (the generic plan, made
// once per connection, here while the tables are nearly empty, as after a deploy on a new database): it must
// reach the key's operation through operations_key by account and key, never scan the account's operations and
// filter them, which would make every retry read all of an account's operations.
func TestLookupPlanReadsOneOperation(t *testing.T) {
	t.Parallel()
	db := testdb.Schema(t)
	var plan []string
	err := db.Connection(func(conn *gorm.DB) error {
		if err := conn.Exec(`SET plan_cache_mode = force_generic_plan`).Error; err != nil {
			return err
		}
		defer conn.Exec(`RESET plan_cache_mode`)
		if err := conn.Exec(`PREPARE lookup_plan (text, text) AS ` + opstore.LookupKeySQL).Error; err != nil {
			return err
		}
		defer conn.Exec(`DEALLOCATE lookup_plan`)
		return conn.Raw(`EXPLAIN EXECUTE lookup_plan('acct_a', 'k')`).Scan(&plan).Error
	})
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if !regexp.MustCompile(`Index Scan using operations_key on operations [^\n]*\n\s*Index Cond: \(\(account_id = \$1\) AND \(idempotency_key = \$2\)\)`).MatchString(text) {
		t.Fatalf("the key's read has a generic plan that does not read the key's operation by account and key:\n%s", text)
	}
}
