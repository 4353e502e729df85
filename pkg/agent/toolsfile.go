package agent

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v4"
	"go.yaml.in/yaml/v4/plugin/loaderlimits"
)

// Limits of a tools file. It is read whole, and YAML can make a small file into a large value (an alias names
// a value written once, and may be named many times, inside values that are named in turn) or a deep one, so
// the file's size, its nesting and the values it makes are all bounded (docs/security.md).
const (
	maxToolsFileBytes = 1 << 20
	// maxToolsDepth bounds nesting: a tool's input schema nests a few levels inside the file's own.
	maxToolsDepth = 64
	// maxToolsValues bounds the values the file makes, counting each time an alias repeats one;
	// maxToolsAliasValues those made through aliases.
	maxToolsValues      = 100_000
	maxToolsAliasValues = 10_000
)

// ServiceDef is one service of a tools file.
type ServiceDef struct {
	Name string `json:"-"`
	// BaseURLEnv is the environment variable that holds the base URL; BaseURL its default.
	BaseURLEnv string `json:"base_url_env"`
	BaseURL    string `json:"base_url"`
	// Operations is where the service serves its operations (pkg/opstatus): GET Operations?idempotency_key=
	// looks an operation up by its key, GET Operations/{id} polls one. Empty: the agent cannot look up, so a
	// financial or destructive tool of the service is refused when the file is read.
	Operations string `json:"operations"`
	// Approvals says the service takes approval requests (a request_approval tool's path, pkg/approval).
	Approvals bool `json:"approvals"`
}

// toolDef is a tool as a tools file spells it.
type toolDef struct {
	Name           string          `json:"name"`
	Kind           string          `json:"kind"`
	Summary        string          `json:"summary"`
	Service        string          `json:"service"`
	Method         string          `json:"method"`
	Path           string          `json:"path"`
	RetryMode      RetryMode       `json:"retry_mode"`
	IdempotencyKey *bool           `json:"idempotency_key"`
	Approval       bool            `json:"approval"`
	InputSchema    json.RawMessage `json:"input_schema"`
	// A command tool's (kind: command, command.go).
	Host    string   `json:"host"`
	Family  Family   `json:"family"`
	Command string   `json:"command"`
	Check   string   `json:"check"`
	Workdir string   `json:"workdir"`
	Secrets []string `json:"secrets"`
}

type toolsFile struct {
	Services map[string]*ServiceDef `json:"services"`
	Hosts    map[string]*HostDef    `json:"hosts"`
	Tools    []toolDef              `json:"tools"`
}

// Catalog is the tools an agent offers and the services they write to, from one tools file.
type Catalog struct {
	services map[string]*ServiceDef
	hosts    map[string]*HostDef
	tools    map[string]Tool
	names    []string
}

// ErrToolsFile: a tools file that cannot be read, or declares a tool the agent could not run safely.
var ErrToolsFile = errors.New("agent: tools file")

// Names reserved for the tools agentmcp adds, and arguments it adds to every tool.
var (
	reservedTools     = []string{"get_operation", "retry_action"}
	reservedArguments = []string{"action_id", "supersedes_action_id", "approval_id", "remediates_operation_id"}
	toolNameRE        = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)
	pathParamRE       = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)
)

// LoadTools reads the tools file at path. A tools file declares the services an agent writes to and the tools it
// offers: YAML (or JSON, which is YAML), served by `retrysafe agent do --tools FILE` and `retrysafe mcp --tools FILE`. The demo
// services' file is demo-tools.yaml, embedded (DemoTools):
//
//	services:
//	  notes:
//	    base_url_env: NOTES_URL            # the environment variable that holds the base URL
//	    base_url: http://127.0.0.1:8096    # its default
//	    operations: /v1/operations         # where pkg/opstatus's routes are: lookup by key, poll by id
//	    approvals: false                   # takes approval requests (POST /v1/approvals, pkg/approval)
//	tools:
//	  - name: create_note
//	    summary: Create a note.
//	    service: notes
//	    method: POST
//	    path: /v1/notes                    # a route template: {name} is a path parameter, a required string argument
//	    retry_mode: create                 # read_only, converge, create, financial or destructive
//	    idempotency_key: true              # default: true for create, financial and destructive
//	    approval: false                    # takes approval_id (sent as Approval-Id)
//	    input_schema:                      # JSON Schema (2020-12) of the arguments, path parameters inside
//	      type: object
//	      required: [author, text]
//	      properties:
//	        author: {type: string, minLength: 1}
//	        text: {type: string}
//
// A tool of kind request_approval asks for a person's approval of another action (input for_action): it has no
// service; its path (/v1/approvals) is a route of the target action's service, which must take approvals.
//
// A tool of kind command runs a command line on a host the file declares under hosts (SSH with a pinned host key
// or a known_hosts file, or local: true): it has host, family (read, converge or effect), command, check (converge
// only), workdir and secrets instead of service, method, path and retry_mode. See HostDef, CommandSpec and
// docs/agents.md.
//
// ParseTools says what it refuses. The file must be a regular file (not a device or a pipe) of at most 1 MiB.
func LoadTools(path string) (*Catalog, error) {
	raw, err := readToolsFile(path)
	if err != nil {
		if pe, ok := errors.AsType[*fs.PathError](err); ok {
			err = pe.Err
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrToolsFile, path, err)
	}
	c, err := ParseTools(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseTools reads a tools file's content, at most 1 MiB, nested at most 64 levels, making at most 100,000
// values (10,000 through aliases), and checks every tool: a known retry mode, a keyed tool where a
// repeat could double an effect, a lookup where the rule needs one, path parameters that are required string
// arguments, and an input schema that compiles.
func ParseTools(raw []byte) (*Catalog, error) {
	js, err := toolsJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrToolsFile, err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	var f toolsFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrToolsFile, err)
	}
	c := &Catalog{services: map[string]*ServiceDef{}, tools: map[string]Tool{}}
	if err := c.addServices(f.Services); err != nil {
		return nil, err
	}
	if err := c.addHosts(f.Hosts); err != nil {
		return nil, err
	}
	if err := c.addTools(f.Tools); err != nil {
		return nil, err
	}
	return c, nil
}

// addServices checks and adds a tools file's services.
func (c *Catalog) addServices(services map[string]*ServiceDef) error {
	for name, s := range services {
		if err := checkService(name, s); err != nil {
			return err
		}
		s.Name = name
		c.services[name] = s
	}
	return nil
}

// checkService accepts a named service with a base URL and, if it serves operations, their path.
func checkService(name string, s *ServiceDef) error {
	if s == nil || !toolNameRE.MatchString(name) {
		return fmt.Errorf("%w: service %q: a service is named in lower case letters, digits and _ and has fields", ErrToolsFile, name)
	}
	if s.BaseURL == "" && s.BaseURLEnv == "" {
		return fmt.Errorf("%w: service %s: give base_url, base_url_env or both", ErrToolsFile, name)
	}
	if p := s.Operations; p != "" && (!strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?#{} ")) {
		return fmt.Errorf("%w: service %s: operations %q is a path (/v1/operations), without query or parameters", ErrToolsFile, name, p)
	}
	return nil
}

// addTools checks and adds a tools file's tools, at least one, each named once.
func (c *Catalog) addTools(defs []toolDef) error {
	if len(defs) == 0 {
		return fmt.Errorf("%w: no tools", ErrToolsFile)
	}
	for _, d := range defs {
		t, err := c.tool(d)
		if err != nil {
			return fmt.Errorf("%w: tool %q: %v", ErrToolsFile, d.Name, err)
		}
		if _, dup := c.tools[t.Name]; dup {
			return fmt.Errorf("%w: tool %q is declared twice", ErrToolsFile, t.Name)
		}
		c.tools[t.Name] = t
		c.names = append(c.names, t.Name)
	}
	slices.Sort(c.names)
	return nil
}

// readToolsFile reads a regular file of at most maxToolsFileBytes: not a device, a pipe or a directory, which
// may never end or never answer.
func readToolsFile(path string) ([]byte, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%s): a tools file is a file", info.Mode().Type())
	}
	tooBig := fmt.Errorf("larger than %d bytes, the most a tools file may hold", maxToolsFileBytes)
	if info.Size() > maxToolsFileBytes {
		return nil, tooBig
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// It may have been replaced or grown since: read one byte past the limit, no more.
	raw, err := io.ReadAll(io.LimitReader(f, maxToolsFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > maxToolsFileBytes {
		return nil, tooBig
	}
	return raw, nil
}

// toolsJSON reads a tools file's YAML (or JSON) within the limits, and writes it as JSON.
func toolsJSON(raw []byte) ([]byte, error) {
	if len(raw) > maxToolsFileBytes {
		return nil, fmt.Errorf("larger than %d bytes, the most a tools file may hold", maxToolsFileBytes)
	}
	limits := loaderlimits.New(
		loaderlimits.DepthFunc(func(depth int, _ *loaderlimits.DepthContext) error {
			if depth > maxToolsDepth {
				return fmt.Errorf("nested deeper than %d levels", maxToolsDepth)
			}
			return nil
		}),
		loaderlimits.AliasFunc(func(aliasValues, values int) error {
			switch {
			case aliasValues > maxToolsAliasValues:
				return fmt.Errorf("its aliases make more than %d values", maxToolsAliasValues)
			case values > maxToolsValues:
				return fmt.Errorf("more than %d values", maxToolsValues)
			}
			return nil
		}))
	var doc any
	if err := yaml.Load(raw, &doc, yaml.WithPlugin(limits)); err != nil {
		return nil, fmt.Errorf("not YAML or JSON within the limits: %v", err)
	}
	js, err := json.Marshal(jsonValue(doc))
	if err != nil {
		return nil, fmt.Errorf("not YAML or JSON: %v", err)
	}
	return js, nil
}

// violation is one check of a tools file's declaration: when it holds, msg says why the declaration is refused.
type violation struct {
	holds bool
	msg   string
}

// firstViolation returns the message of the first violation that holds, in the order given, as an error; nil
// when none holds.
func firstViolation(vs ...violation) error {
	for _, v := range vs {
		if v.holds {
			return errors.New(v.msg)
		}
	}
	return nil
}

// jsonValue makes what the YAML decoder returns into what encoding/json writes as the file says it: a mapping's
// keys as text, and a date or time as the text it was written as (RFC 3339).
func jsonValue(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = jsonValue(e)
		}
		return v
	case map[any]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[fmt.Sprint(k)] = jsonValue(e)
		}
		return out
	case []any:
		for i, e := range v {
			v[i] = jsonValue(e)
		}
		return v
	case time.Time:
		if v.Equal(v.Truncate(24*time.Hour)) && v.Location() == time.UTC {
			return v.Format(time.DateOnly)
		}
		return v.Format(time.RFC3339Nano)
	}
	return v
}

func (c *Catalog) tool(d toolDef) (Tool, error) {
	if !toolNameRE.MatchString(d.Name) || slices.Contains(reservedTools, d.Name) {
		return Tool{}, fmt.Errorf("a tool name is 1 to 64 lower case letters, digits and _, starting with a letter, and not one of %v", reservedTools)
	}
	if d.Kind == "command" {
		return c.commandTool(d)
	}
	if d.hasCommandFields() {
		return Tool{}, errors.New("host, family, command, check, workdir and secrets belong to a tool of kind command")
	}
	t, err := requestTool(d)
	if err != nil {
		return Tool{}, err
	}
	if err := c.checkRequestKind(d, &t); err != nil {
		return Tool{}, err
	}
	if err := t.compile(d.InputSchema); err != nil {
		return Tool{}, err
	}
	return t, nil
}

// hasCommandFields says d sets a field only a tool of kind command has.
func (d toolDef) hasCommandFields() bool {
	return d.Host != "" || d.Family != "" || d.Command != "" || d.Check != "" || d.Workdir != "" || d.Secrets != nil
}

// requestTool reads what every HTTP tool has: a summary, a retry mode, whether it is keyed, a write method and a
// route template.
func requestTool(d toolDef) (Tool, error) {
	t := Tool{Name: d.Name, Summary: strings.TrimSpace(d.Summary), Service: d.Service, Method: strings.ToUpper(d.Method),
		Route: d.Path, Mode: d.RetryMode, Approval: d.Approval}
	if t.Summary == "" {
		return Tool{}, errors.New("summary is required: it is what a model reads to choose the tool")
	}
	if t.Mode.Rule() == "" {
		return Tool{}, fmt.Errorf("retry_mode %q: want read_only, converge, create, financial or destructive", d.RetryMode)
	}
	keyed, err := toolKeyed(t.Mode, d.IdempotencyKey)
	if err != nil {
		return Tool{}, err
	}
	t.Keyed = keyed
	if !slices.Contains([]string{"POST", "PUT", "PATCH", "DELETE"}, t.Method) {
		return Tool{}, fmt.Errorf("method %q: want POST, PUT, PATCH or DELETE (the agent makes writes)", d.Method)
	}
	if err := checkRoute(d.Path); err != nil {
		return Tool{}, err
	}
	return t, nil
}

// toolKeyed decides whether a tool sends an Idempotency-Key: create, financial and destructive tools do, and the
// file may add a key to another mode but never take one away from those.
func toolKeyed(mode RetryMode, declared *bool) (bool, error) {
	keyed := mode == Create || mode == Financial || mode == Destructive
	if declared == nil {
		return keyed, nil
	}
	if !*declared && keyed {
		return false, fmt.Errorf("retry_mode %s sends an Idempotency-Key: only a key makes its retry safe", mode)
	}
	return *declared, nil
}

// checkRoute accepts a route template without query whose parameters are whole segments, {name}.
func checkRoute(route string) error {
	if !strings.HasPrefix(route, "/") || strings.ContainsAny(route, "?# ") {
		return fmt.Errorf("path %q: want a route template such as /v1/notes/{id}, without query", route)
	}
	for _, seg := range strings.Split(route, "/") {
		if strings.ContainsAny(seg, "{}") && (!strings.HasPrefix(seg, "{") || !strings.HasSuffix(seg, "}") || !pathParamRE.MatchString(seg[1:len(seg)-1])) {
			return fmt.Errorf("path %q: a parameter is a whole segment, {name}, in lower case letters, digits and _", route)
		}
	}
	return nil
}

// checkRequestKind checks what a request tool and a request_approval tool each need, and marks the latter.
func (c *Catalog) checkRequestKind(d toolDef, t *Tool) error {
	switch d.Kind {
	case "", "request":
		return c.checkRequestService(d, *t)
	case "request_approval":
		if d.Service != "" || t.Approval {
			return errors.New("a request_approval tool has no service and takes no approval: its path is a route of its target's service")
		}
		if t.Mode != Create || !t.Keyed {
			return errors.New("a request_approval tool has retry_mode create")
		}
		t.ApprovalRequest = true
		return nil
	default:
		return fmt.Errorf("kind %q: want request (the default), request_approval or command", d.Kind)
	}
}

// checkRequestService checks that a request tool's service exists and serves what the tool's rule relies on.
func (c *Catalog) checkRequestService(d toolDef, t Tool) error {
	s := c.services[d.Service]
	if s == nil {
		return fmt.Errorf("service %q is not among the file's services", d.Service)
	}
	if s.Operations == "" && (t.Mode == Financial || t.Mode == Destructive) {
		return fmt.Errorf("retry_mode %s looks an operation up before it sends again: service %s needs operations", t.Mode, s.Name)
	}
	if t.Approval && !s.Approvals {
		return fmt.Errorf("approval tools need a service that takes approvals: service %s has approvals: false", s.Name)
	}
	return nil
}

// Tool returns the tool named name.
func (c *Catalog) Tool(name string) (Tool, bool) {
	t, ok := c.tools[name]
	return t, ok
}

// Names lists the tools in a stable order.
func (c *Catalog) Names() []string { return slices.Clone(c.names) }

// Service returns the service named name.
func (c *Catalog) Service(name string) (ServiceDef, bool) {
	s, ok := c.services[name]
	if !ok {
		return ServiceDef{}, false
	}
	return *s, true
}

// BaseURLs are the services' base URLs: each one's base_url_env as getenv reads it, else its base_url.
func (c *Catalog) BaseURLs(getenv func(string) string) map[string]string {
	out := map[string]string{}
	for name, s := range c.services {
		u := s.BaseURL
		if s.BaseURLEnv != "" && getenv(s.BaseURLEnv) != "" {
			u = getenv(s.BaseURLEnv)
		}
		out[name] = strings.TrimRight(u, "/")
	}
	return out
}

//go:embed demo-tools.yaml
var demoToolsFile []byte

var demoTools = sync.OnceValue(func() *Catalog {
	c, err := ParseTools(demoToolsFile)
	if err != nil {
		panic("agent: demo-tools.yaml: " + err.Error())
	}
	return c
})

// DemoTools is the tools of the demo services (tickets, payments, deploys), the embedded demo-tools.yaml: what
// an agent offers when given no tools file.
func DemoTools() *Catalog { return demoTools() }
