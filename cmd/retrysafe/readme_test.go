package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeKeepsUp holds the README (and the command's usage) to what the repository is: the module an adopter
// installs, every fuzz target, the number of tests that tamper on purpose, every command, what make lint runs,
// and no path outside the repository.
func TestReadmeKeepsUp(t *testing.T) {
	t.Parallel()
	readme := readFile(t, "../../README.md")
	gomod := readFile(t, "../../go.mod")
	module := strings.TrimSpace(strings.TrimPrefix(strings.SplitN(gomod, "\n", 2)[0], "module"))
	if !strings.Contains(readme, "go get "+module) {
		t.Errorf("README never says go get %s", module)
	}

	fuzz, tampered := map[string]bool{}, 0
	fuzzFunc := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(`)
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != "../.." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") || strings.HasPrefix(path, "../../examples/") {
			return nil
		}
		src := readFile(t, path)
		for _, m := range fuzzFunc.FindAllStringSubmatch(src, -1) {
			fuzz[m[1]] = true
		}
		if !strings.HasSuffix(path, "readme_test.go") {
			tampered += strings.Count(src, ".Tampered()")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name := range fuzz {
		if !strings.Contains(readme, "`"+name+"`") {
			t.Errorf("README's fuzz targets lack %s", name)
		}
	}
	words := []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"}
	if tampered >= len(words) || !strings.Contains(readme, "the "+words[tampered]+" tests that tamper on purpose") {
		t.Errorf("README does not say the %d tests that tamper on purpose", tampered)
	}

	usage := readFile(t, "main.go")
	for _, c := range commands {
		if !strings.Contains(usage, "retrysafe "+c.name) {
			t.Errorf("main.go's usage lacks retrysafe %s", c.name)
		}
		if c.name != "help" && c.name != "version" && !strings.Contains(readme, "`"+c.name+"`") {
			t.Errorf("README's layout lacks the command %s", c.name)
		}
	}
	for _, sub := range []string{"verify", "export", "public-key", "timeline"} {
		if !strings.Contains(usage, sub) {
			t.Errorf("main.go's usage lacks audit %s", sub)
		}
	}

	makefile := readFile(t, "../../Makefile")
	lintLine := regexp.MustCompile(`(?m)^make lint .*$`).FindString(readme)
	for _, tool := range []string{"staticcheck", "deadcode", "Spectral"} {
		if strings.Contains(makefile, strings.ToLower(tool)) && !strings.Contains(lintLine, tool) {
			t.Errorf("README's make lint line %q omits %s, which make lint runs", lintLine, tool)
		}
	}
	if m := regexp.MustCompile(`\.\./[\w./-]+`).FindString(readme); m != "" {
		t.Errorf("README cites %s, a path outside the repository", m)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
