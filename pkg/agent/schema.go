package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

var english = message.NewPrinter(language.English)

// Arguments are checked against the tool's input schema (JSON Schema 2020-12, with santhosh-tekuri/jsonschema:
// every failure, each at the argument it is about) before anything is journaled or sent, so a bad argument
// burns no action id: the same action id with good arguments then makes the write.

// ArgumentError is a call refused for its arguments: each problem names the argument (a JSON pointer into the
// arguments, "" for the object itself) and what is wrong with it. errors.Is(err, ErrBadArguments) holds.
type ArgumentError struct {
	Tool     string
	Problems []ArgumentProblem
}

// ArgumentProblem is one argument's fault.
type ArgumentProblem struct {
	Argument string `json:"argument"`
	Message  string `json:"message"`
}

func (e *ArgumentError) Error() string {
	parts := make([]string, 0, len(e.Problems))
	for _, p := range e.Problems {
		if p.Argument == "" {
			parts = append(parts, p.Message)
		} else {
			parts = append(parts, fmt.Sprintf("argument %q: %s", p.Argument, p.Message))
		}
	}
	return fmt.Sprintf("%v: %s: %s; nothing was journaled or sent, and the action id is still free", ErrBadArguments, e.Tool,
		strings.Join(parts, "; "))
}

func (e *ArgumentError) Unwrap() error { return ErrBadArguments }

// refusingLoader loads no schema from anywhere: a tool's input schema is whole in the tools file ($ref only
// into itself, such as #/$defs/...).
type refusingLoader struct{}

func (refusingLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("input schemas are self-contained: %s is not loaded", url)
}

// compile reads the tool's input schema, checks it describes the arguments (an object whose path parameters are
// required strings, with none of the names the agent adds) and compiles it, approval_id added to approval tools.
func (t *Tool) compile(raw json.RawMessage) error {
	schema, err := objectSchema(raw)
	if err != nil {
		return err
	}
	if err := t.checkArguments(schema); err != nil {
		return err
	}
	t.InputSchema = schema
	t.schema, err = compileSchema("retrysafe:tools/"+t.Name+".json", t.Schema())
	return err
}

// objectSchema decodes an input schema, which must describe one JSON object.
func objectSchema(raw json.RawMessage) (map[string]any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, errors.New("input_schema is required (JSON Schema of the arguments; {type: object} for none)")
	}
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil || schema == nil {
		return nil, errors.New("input_schema must be a JSON Schema object")
	}
	if schema["type"] != "object" {
		return nil, errors.New("input_schema must have type: object (the arguments are one JSON object)")
	}
	return schema, nil
}

// checkArguments checks that the schema's properties leave the agent's own names to the agent and have each
// argument the tool's route (and, for a request_approval tool, the approval) needs as a required string.
func (t *Tool) checkArguments(schema map[string]any) error {
	props, _ := schema["properties"].(map[string]any)
	var required []string
	if list, ok := schema["required"].([]any); ok {
		for _, r := range list {
			if s, ok := r.(string); ok {
				required = append(required, s)
			}
		}
	}
	isRequiredString := func(name string) bool {
		ps, _ := props[name].(map[string]any)
		return ps != nil && ps["type"] == "string" && slices.Contains(required, name)
	}
	for _, name := range reservedArguments {
		if _, ok := props[name]; ok {
			return fmt.Errorf("input_schema declares %s, which the agent adds itself", name)
		}
	}
	for _, p := range t.PathParams() {
		if !isRequiredString(p) {
			return fmt.Errorf("path parameter %s must be a required property of type string in input_schema", p)
		}
	}
	if t.ApprovalRequest && !isRequiredString("for_action") {
		return errors.New("a request_approval tool's input_schema has for_action, a required string (the action to approve)")
	}
	return nil
}

// compileSchema compiles a self-contained JSON Schema 2020-12, formats asserted, under the name url.
func compileSchema(url string, schema any) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(mustJSON(schema)))
	if err != nil {
		return nil, fmt.Errorf("input_schema: %v", err)
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(refusingLoader{})
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource(url, doc); err != nil {
		return nil, fmt.Errorf("input_schema: %v", err)
	}
	compiled, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("input_schema is not a valid JSON Schema: %v", err)
	}
	return compiled, nil
}

// validate checks args, a JSON object, against the tool's input schema.
func (t Tool) validate(args json.RawMessage) error {
	if t.schema == nil {
		return nil
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
	if err != nil {
		return &ArgumentError{Tool: t.Name, Problems: []ArgumentProblem{{Message: "the arguments must be a JSON object"}}}
	}
	err = t.schema.Validate(inst)
	var ve *jsonschema.ValidationError
	if err == nil {
		return nil
	}
	if !errors.As(err, &ve) {
		return &ArgumentError{Tool: t.Name, Problems: []ArgumentProblem{{Message: err.Error()}}}
	}
	ae := &ArgumentError{Tool: t.Name}
	for _, leaf := range leaves(ve) {
		arg := strings.Join(leaf.InstanceLocation, "/")
		msg := leaf.ErrorKind.LocalizedString(english)
		if arg == "" {
			// Faults of the object itself name their arguments: "missing property 'title'".
			msg = strings.NewReplacer("property ", "argument ", "properties ", "arguments ").Replace(msg)
		}
		ae.Problems = append(ae.Problems, ArgumentProblem{Argument: arg, Message: msg})
	}
	slices.SortStableFunc(ae.Problems, func(x, y ArgumentProblem) int { return strings.Compare(x.Argument, y.Argument) })
	if len(ae.Problems) == 0 {
		ae.Problems = []ArgumentProblem{{Message: ve.ErrorKind.LocalizedString(english)}}
	}
	return ae
}

// leaves are the failures at the bottom of a validation error's tree: the ones about a value.
func leaves(ve *jsonschema.ValidationError) []*jsonschema.ValidationError {
	if len(ve.Causes) == 0 {
		return []*jsonschema.ValidationError{ve}
	}
	var out []*jsonschema.ValidationError
	for _, c := range ve.Causes {
		out = append(out, leaves(c)...)
	}
	return out
}

func mustJSON(v any) []byte {
	raw, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return raw
}

// deepCopy copies a JSON value decoded into any.
func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		s := make([]any, len(x))
		for i, e := range x {
			s[i] = deepCopy(e)
		}
		return s
	}
	return v
}
