package conformancetest_test

import (
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/retrysafe/retrysafe/internal/testdb"
	"github.com/retrysafe/retrysafe/pkg/conformance"
)

// TestDeploysCountCommandTakesItsValueAsData runs the count command of examples/conformance/deploys.json, as
// conformance runs it, with a CONFORMANCE_UNIQUE that would end the SQL string and run statements and shell of
// its own if it were spliced into either: the command counts the rows of that exact environment name (none) and
// nothing else runs. Request files are copied from the examples, so the example shows the safe way.
func TestDeploysCountCommandTakesItsValueAsData(t *testing.T) {
	t.Parallel()
	spec, err := conformance.LoadSpec("../../examples/conformance/deploys.json")
	if err != nil {
		t.Fatal(err)
	}
	db := testdb.Schema(t)
	marks := t.TempDir()
	table := "pwned_" + strings.ToLower(rand.Text()[:12])
	value := "x'; CREATE TABLE " + table + " (); SELECT '$(touch " + filepath.Join(marks, "shell") + ")"
	cmd := exec.Command("sh", "-c", spec.Count.Command)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+libpqURL(t, db), "CONFORMANCE_UNIQUE="+value)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("count command: %v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "0" {
		t.Errorf("count command printed %q; want 0", got)
	}
	var created bool
	if err := db.DB.Raw(`SELECT to_regclass(?) IS NOT NULL`, table).Scan(&created).Error; err != nil {
		t.Fatal(err)
	}
	if created {
		t.Errorf("the value ran as SQL: table %s was created", table)
		db.DB.Exec("DROP TABLE " + table) // the schema is lent to other tests next
	}
	if entries, _ := os.ReadDir(marks); len(entries) > 0 {
		t.Error("the value ran as shell")
	}
}
