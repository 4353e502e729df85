package failpoint_test

import (
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/failpoint"
)

// TestFromEnvironment runs this test binary again with RETRYSAFE_FAILPOINTS set: FromEnvironment alone must arm
// the point, so Hit exits the process there (86), as a service on pkg/idem does with no wiring of its own. A
// value that does not parse is an error naming the variable.
func TestFromEnvironment(t *testing.T) {
	switch os.Getenv("FAILPOINT_CHILD") {
	case "armed":
		if err := failpoint.FromEnvironment(); err != nil {
			t.Fatal(err)
		}
		failpoint.Hit("test.point")
		t.Fatal("Hit returned at an armed exit point")
	case "bad":
		if err := failpoint.FromEnvironment(); err == nil {
			t.Fatal("FromEnvironment accepted a bad value")
		}
		return
	case "":
	default:
		return
	}
	child := func(mode, spec string) error {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestFromEnvironment$")
		cmd.Env = append(os.Environ(), "FAILPOINT_CHILD="+mode, failpoint.EnvVar+"="+spec)
		out, err := cmd.CombinedOutput()
		t.Logf("%s: %s", mode, out)
		return err
	}
	var ee *exec.ExitError
	if err := child("armed", "test.point=exit"); !errors.As(err, &ee) || ee.ExitCode() != 86 {
		t.Errorf("child with %s=test.point=exit ended %v; want exit code 86 at the point", failpoint.EnvVar, err)
	}
	if err := child("bad", "test.point=explode"); err != nil {
		t.Errorf("child with a bad value: %v", err)
	}
}
