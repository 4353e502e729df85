package agent

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/goccy/go-yaml"

	"github.com/retrysafe/retrysafe/pkg/jsondepth"
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
}

type toolsFile struct {
	Services map[string]*ServiceDef `json:"services"`
	Tools    []toolDef              `json:"tools"`
}

// Catalog is the tools an agent offers and the services they write to, from one tools file.
type Catalog struct {
	services map[string]*ServiceDef
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
// ParseTools says what it refuses.
func LoadTools(path string) (*Catalog, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrToolsFile, err)
	}
	c, err := ParseTools(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseTools reads a tools file's content and checks every tool: a known retry mode, a keyed tool where a
// repeat could double an effect, a lookup where the rule needs one, path parameters that are required string
// arguments, and an input schema that compiles.
func ParseTools(raw []byte) (*Catalog, error) {
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: not YAML or JSON: %v", ErrToolsFile, err)
	}
	dec := json.NewDecoder(jsondepth.Reader(bytes.NewReader(js)))
	dec.DisallowUnknownFields()
	var f toolsFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrToolsFile, err)
	}
	c := &Catalog{services: map[string]*ServiceDef{}, tools: map[string]Tool{}}
	for name, s := range f.Services {
		if s == nil || !toolNameRE.MatchString(name) {
			return nil, fmt.Errorf("%w: service %q: a service is named in lower case letters, digits and _ and has fields", ErrToolsFile, name)
		}
		if s.BaseURL == "" && s.BaseURLEnv == "" {
			return nil, fmt.Errorf("%w: service %s: give base_url, base_url_env or both", ErrToolsFile, name)
		}
		if p := s.Operations; p != "" && (!strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?#{} ")) {
			return nil, fmt.Errorf("%w: service %s: operations %q is a path (/v1/operations), without query or parameters", ErrToolsFile, name, p)
		}
		s.Name = name
		c.services[name] = s
	}
	if len(f.Tools) == 0 {
		return nil, fmt.Errorf("%w: no tools", ErrToolsFile)
	}
	for _, d := range f.Tools {
		t, err := c.tool(d)
		if err != nil {
			return nil, fmt.Errorf("%w: tool %q: %v", ErrToolsFile, d.Name, err)
		}
		if _, dup := c.tools[t.Name]; dup {
			return nil, fmt.Errorf("%w: tool %q is declared twice", ErrToolsFile, t.Name)
		}
		c.tools[t.Name] = t
		c.names = append(c.names, t.Name)
	}
	slices.Sort(c.names)
	return c, nil
}

func (c *Catalog) tool(d toolDef) (Tool, error) {
	if !toolNameRE.MatchString(d.Name) || slices.Contains(reservedTools, d.Name) {
		return Tool{}, fmt.Errorf("a tool name is 1 to 64 lower case letters, digits and _, starting with a letter, and not one of %v", reservedTools)
	}
	t := Tool{Name: d.Name, Summary: strings.TrimSpace(d.Summary), Service: d.Service, Method: strings.ToUpper(d.Method),
		Route: d.Path, Mode: d.RetryMode, Approval: d.Approval}
	if t.Summary == "" {
		return Tool{}, errors.New("summary is required: it is what a model reads to choose the tool")
	}
	if t.Mode.Rule() == "" {
		return Tool{}, fmt.Errorf("retry_mode %q: want read_only, converge, create, financial or destructive", d.RetryMode)
	}
	t.Keyed = t.Mode == Create || t.Mode == Financial || t.Mode == Destructive
	if d.IdempotencyKey != nil {
		if !*d.IdempotencyKey && t.Keyed {
			return Tool{}, fmt.Errorf("retry_mode %s sends an Idempotency-Key: only a key makes its retry safe", t.Mode)
		}
		t.Keyed = *d.IdempotencyKey
	}
	if !slices.Contains([]string{"POST", "PUT", "PATCH", "DELETE"}, t.Method) {
		return Tool{}, fmt.Errorf("method %q: want POST, PUT, PATCH or DELETE (the agent makes writes)", d.Method)
	}
	if !strings.HasPrefix(t.Route, "/") || strings.ContainsAny(t.Route, "?# ") {
		return Tool{}, fmt.Errorf("path %q: want a route template such as /v1/notes/{id}, without query", d.Path)
	}
	for _, seg := range strings.Split(t.Route, "/") {
		if strings.ContainsAny(seg, "{}") && (!strings.HasPrefix(seg, "{") || !strings.HasSuffix(seg, "}") || !pathParamRE.MatchString(seg[1:len(seg)-1])) {
			return Tool{}, fmt.Errorf("path %q: a parameter is a whole segment, {name}, in lower case letters, digits and _", d.Path)
		}
	}
	switch d.Kind {
	case "", "request":
		s := c.services[d.Service]
		if s == nil {
			return Tool{}, fmt.Errorf("service %q is not among the file's services", d.Service)
		}
		if s.Operations == "" && (t.Mode == Financial || t.Mode == Destructive) {
			return Tool{}, fmt.Errorf("retry_mode %s looks an operation up before it sends again: service %s needs operations", t.Mode, s.Name)
		}
		if t.Approval && !s.Approvals {
			return Tool{}, fmt.Errorf("approval tools need a service that takes approvals: service %s has approvals: false", s.Name)
		}
	case "request_approval":
		if d.Service != "" || t.Approval {
			return Tool{}, errors.New("a request_approval tool has no service and takes no approval: its path is a route of its target's service")
		}
		if t.Mode != Create || !t.Keyed {
			return Tool{}, errors.New("a request_approval tool has retry_mode create")
		}
		t.ApprovalRequest = true
	default:
		return Tool{}, fmt.Errorf("kind %q: want request (the default) or request_approval", d.Kind)
	}
	if err := t.compile(d.InputSchema); err != nil {
		return Tool{}, err
	}
	return t, nil
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
