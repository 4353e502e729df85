package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// count returns the number of effects that exist now.
func (r *runner) count(ctx context.Context, c *caseRun) (int64, error) {
	if r.opts.Counter != nil {
		return r.opts.Counter(ctx, c.vars)
	}
	if r.spec.Count.Command != "" {
		return r.countCommand(ctx, c)
	}
	u, err := r.countURL()
	if err != nil {
		return 0, err
	}
	base := *u
	base.Path, base.RawQuery = "", ""
	path := u.Path
	if u.RawQuery != "" {
		path += "?" + u.RawQuery
	}
	a := r.send(ctx, r.client, &base, http.MethodGet, path, r.spec.Count.Headers, nil, nil, c.vars)
	if a.err != nil {
		return 0, fmt.Errorf("count: %v", a.err)
	}
	if a.status != http.StatusOK {
		return 0, fmt.Errorf("count: GET %s answered %s", path, a.describe())
	}
	if r.spec.Count.Length != "" {
		v, err := lookup(a.body, r.spec.Count.Length)
		if err != nil {
			return 0, fmt.Errorf("count: %v", err)
		}
		list, ok := v.([]any)
		if !ok {
			return 0, fmt.Errorf("count: %s is not a list", r.spec.Count.Length)
		}
		return int64(len(list)), nil
	}
	v, err := lookup(a.body, r.spec.Count.Field)
	if err != nil {
		return 0, fmt.Errorf("count: %v", err)
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("count: %s is not a number", r.spec.Count.Field)
	}
	return parseCount(n.String())
}

// countCommand runs the count command with sh -c, its text exactly as the file wrote it (check refuses
// placeholders in it). The case's values, some of them from the target's answers, reach it only through its
// environment, as CONFORMANCE_<NAME>: text the shell never parses.
func (r *runner) countCommand(ctx context.Context, c *caseRun) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.RequestTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", r.spec.Count.Command)
	cmd.Env = append(os.Environ(), r.opts.Env...)
	for k, v := range c.vars {
		cmd.Env = append(cmd.Env, envName(k)+"="+v)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("count command: %v: %s", err, strings.TrimSpace(lastLine(stderr.String())))
	}
	return parseCount(strings.TrimSpace(string(out)))
}

func parseCount(s string) (int64, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, fmt.Errorf("count: %q is not an integer", truncate(s, 40))
	}
	return int64(f), nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return truncate(s, 200)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// lookup follows a dotted path ("items", "data.total", "items.0.id", "." for the whole value) in a JSON body.
func lookup(body []byte, path string) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("answer is not JSON")
	}
	if path == "." || path == "" {
		return v, nil
	}
	for _, part := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			next, ok := x[part]
			if !ok {
				return nil, fmt.Errorf("no %q in the answer", path)
			}
			v = next
		case []any:
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(x) {
				return nil, fmt.Errorf("no %q in the answer", path)
			}
			v = x[i]
		default:
			return nil, fmt.Errorf("no %q in the answer", path)
		}
	}
	return v, nil
}
