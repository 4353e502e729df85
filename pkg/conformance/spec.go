package conformance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/textproto"
	"os"
	"regexp"
	"strings"

	"github.com/retrysafe/retrysafe/pkg/jsondepth"
)

// Spec describes one write to check; it is the request file, in JSON.
//
// Strings in path, headers, body, variant, setup and the count url and headers may hold placeholders:
// {{unique}} is a token of lowercase letters, digits and a dash, new for every case, so each case creates its own
// resource (a new order id, a new environment); {{name}} is a value a setup step saved. Each is escaped for where
// it lands (a path segment, a query value, a JSON string). Header values may name environment variables as
// ${NAME}: that is the only way to pass a secret. The count url may name them too, for an address that moves
// ("${PROVIDER_URL}/admin/counters"). An Authorization header written out in the file is refused.
//
// The count command and the kill hook are never filled: a saved value comes from the target's answer, and no
// quoting survives every shell and SQL context it could be spliced into. The count command reads the case's
// values from its environment instead, as CONFORMANCE_UNIQUE and CONFORMANCE_<NAME>; it must use them as data,
// e.g. "$CONFORMANCE_INTENT" in double quotes in the shell, or psql -v intent="$CONFORMANCE_INTENT" and :'intent'
// in SQL read from standard input.
type Spec struct {
	// Name is what the report calls the write; by default "METHOD path".
	Name    string            `json:"name,omitempty"`
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Headers map[string]string `json:"headers,omitempty"`
	// Body is the request body, a JSON value. Variant is the same write with a different intent (another
	// amount, another title): sent under the same key it must be refused.
	Body    json.RawMessage `json:"body"`
	Variant json.RawMessage `json:"variant"`
	// Count tells how many effects exist; see Count.
	Count Count `json:"count"`
	// Setup runs before every case, for writes that need a resource of their own (a capture needs an intent).
	Setup []Step `json:"setup,omitempty"`
	// KeyHeader is the idempotency key header; default Idempotency-Key.
	KeyHeader string `json:"key_header,omitempty"`
	// ReplayMarker is the header that marks a replay, "Name" or "Name: value"; default "Idempotent-Replayed: true".
	ReplayMarker string `json:"replay_marker,omitempty"`
	// Copies is how many copies case 2 sends at once; default 50, at most 500.
	Copies int `json:"copies,omitempty"`
	// KillHook, when set, is a shell command that kills the worker after it claimed the key (and brings the
	// service back); without it case 7 is reported as not checked.
	KillHook string `json:"kill_hook,omitempty"`
}

// Count is how the effect is counted, by one of:
//   - a GET (URL: a path on the target, or an absolute URL on an address named with Options.Allow) whose JSON
//     answer holds a list (Length: a dotted path to it, "." for the whole answer) or a number (Field);
//   - a shell Command (run with sh -c, its text as written) that prints one integer; the case's values are in its
//     environment as CONFORMANCE_UNIQUE and CONFORMANCE_<NAME> for each saved name.
type Count struct {
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	Length  string            `json:"length,omitempty"`
	Field   string            `json:"field,omitempty"`
	Command string            `json:"command,omitempty"`
}

// Step is one setup request. Save names values of its JSON answer (dotted paths) to use as {{name}} later (and
// as $CONFORMANCE_<NAME> in the count command); a name is a letter or underscore, then letters, digits and
// underscores.
type Step struct {
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    json.RawMessage   `json:"body,omitempty"`
	Save    map[string]string `json:"save,omitempty"`
}

// LoadSpec reads and checks a request file.
func LoadSpec(path string) (Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Spec{}, err
	}
	return ParseSpec(data)
}

// ParseSpec decodes a request file strictly (unknown fields are errors, nesting past jsondepth.Max too) and
// checks it.
func ParseSpec(data []byte) (Spec, error) {
	if err := jsondepth.Check(data); err != nil {
		return Spec{}, fmt.Errorf("request file: %w", err)
	}
	var s Spec
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return Spec{}, fmt.Errorf("request file: %w", err)
	}
	if err := s.check(); err != nil {
		return Spec{}, fmt.Errorf("request file: %w", err)
	}
	return s, nil
}

const (
	defaultCopies = 50
	maxCopies     = 500
	maxSetupSteps = 10
)

// check checks a spec and fills in its defaults.
func (s *Spec) check() error {
	s.Method = strings.ToUpper(s.Method)
	if err := s.checkRequest(); err != nil {
		return err
	}
	if err := s.Count.check(); err != nil {
		return fmt.Errorf("count: %w", err)
	}
	if len(s.Setup) > maxSetupSteps {
		return fmt.Errorf("setup: at most %d steps", maxSetupSteps)
	}
	for i := range s.Setup {
		if err := s.Setup[i].check(); err != nil {
			return fmt.Errorf("setup %d: %w", i+1, err)
		}
	}
	if s.KeyHeader == "" {
		s.KeyHeader = "Idempotency-Key"
	}
	s.KeyHeader = textproto.CanonicalMIMEHeaderKey(s.KeyHeader)
	if s.ReplayMarker == "" {
		s.ReplayMarker = "Idempotent-Replayed: true"
	}
	if s.Copies == 0 {
		s.Copies = defaultCopies
	}
	if s.Copies < 2 || s.Copies > maxCopies {
		return fmt.Errorf("copies must be 2 to %d", maxCopies)
	}
	if s.Name == "" {
		s.Name = s.Method + " " + s.Path
	}
	return nil
}

// checkRequest checks the write itself: a write method, a path, a body and a variant that differs from it, and
// headers that carry no secret written out.
func (s *Spec) checkRequest() error {
	switch s.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		return fmt.Errorf("method %q: a write is POST, PUT, PATCH or DELETE", s.Method)
	}
	if !strings.HasPrefix(s.Path, "/") {
		return fmt.Errorf("path %q must start with /", s.Path)
	}
	if !json.Valid(s.Body) {
		return fmt.Errorf("body must be a JSON value")
	}
	if !json.Valid(s.Variant) {
		return fmt.Errorf("variant must be a JSON value (the same write with a different intent)")
	}
	if jsonEqual(s.Body, s.Variant) {
		return fmt.Errorf("variant must differ from body")
	}
	return checkHeaders(s.Headers)
}

// check checks that a count is one way of counting, and a command that is never filled.
func (c *Count) check() error {
	if err := checkHeaders(c.Headers); err != nil {
		return err
	}
	if c.URL != "" && (c.Length == "") == (c.Field == "") {
		return fmt.Errorf("with url, name exactly one of length (a list) or field (a number)")
	}
	if c.URL != "" && c.Command != "" {
		return fmt.Errorf("url or command, not both")
	}
	if m := placeholder.FindStringSubmatch(c.Command); m != nil {
		return fmt.Errorf("command: {{%s}} is never filled into a command (a value from the target could run as "+
			"code); read it from the environment, quoted, as \"$%s\"", m[1], envName(m[1]))
	}
	return nil
}

// check checks a setup step: a method, a path, a JSON body if any, headers and the names it saves.
func (st *Step) check() error {
	st.Method = strings.ToUpper(st.Method)
	if st.Method == "" || !strings.HasPrefix(st.Path, "/") {
		return fmt.Errorf("method and a path starting with / are required")
	}
	if len(st.Body) > 0 && !json.Valid(st.Body) {
		return fmt.Errorf("body must be a JSON value")
	}
	if err := checkHeaders(st.Headers); err != nil {
		return err
	}
	for name := range st.Save {
		if !varName.MatchString(name) {
			return fmt.Errorf("save %q: a name is a letter or underscore, then letters, digits and underscores", name)
		}
	}
	return nil
}

var (
	envRef  = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)
	varName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// envName names the count command's environment variable that holds the case's value called name.
func envName(name string) string { return "CONFORMANCE_" + strings.ToUpper(name) }

// checkHeaders refuses credentials written into the file: they belong in the environment.
func checkHeaders(h map[string]string) error {
	for name, value := range h {
		switch textproto.CanonicalMIMEHeaderKey(name) {
		case "Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key":
			if !envRef.MatchString(value) {
				return fmt.Errorf("header %s must take its secret from the environment, as ${NAME}", name)
			}
		}
	}
	return nil
}

var placeholder = regexp.MustCompile(`\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}`)

// fill replaces {{name}} placeholders with vars, escaping each value with esc.
func fill(s string, vars map[string]string, esc func(string) string) (string, error) {
	var missing []string
	out := placeholder.ReplaceAllStringFunc(s, func(m string) string {
		name := placeholder.FindStringSubmatch(m)[1]
		v, ok := vars[name]
		if !ok {
			missing = append(missing, name)
			return m
		}
		return esc(v)
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("no value for {{%s}} (a setup step saves values with save)", missing[0])
	}
	return out, nil
}

// headerRef is a placeholder or an environment reference in a header value.
var headerRef = regexp.MustCompile(`\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}|\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// expandHeader fills a header value's {{name}} placeholders with vars and its ${NAME} references with getenv, in
// one pass over the text the file wrote: a saved value that itself reads ${NAME} stays that text, so a target
// cannot have the run send it an environment variable of its choosing.
func expandHeader(s string, vars map[string]string, getenv func(string) string) (string, error) {
	var missing string
	out := headerRef.ReplaceAllStringFunc(s, func(m string) string {
		sub := headerRef.FindStringSubmatch(m)
		if sub[2] != "" {
			return getenv(sub[2])
		}
		v, ok := vars[sub[1]]
		if !ok && missing == "" {
			missing = sub[1]
		}
		return v
	})
	if missing != "" {
		return "", fmt.Errorf("no value for {{%s}} (a setup step saves values with save)", missing)
	}
	return out, nil
}

// jsonString escapes a value for use inside a JSON string.
func jsonString(v string) string {
	b, _ := json.Marshal(v)
	return string(b[1 : len(b)-1])
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}
