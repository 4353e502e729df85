package conformance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/retrysafe/retrysafe/pkg/jsondepth"
)

// reorderJSON returns the same JSON value with every object's members in reverse order and other whitespace:
// a different byte string for the same request.
func reorderJSON(b []byte) ([]byte, error) {
	if err := jsondepth.Check(b); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := readOrdered(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("trailing data after the JSON value")
	}
	var out bytes.Buffer
	out.WriteString("\n ")
	if err := writeReordered(&out, v, "  "); err != nil {
		return nil, err
	}
	out.WriteString(" \n")
	return out.Bytes(), nil
}

type member struct {
	name  string
	value any
}

type object []member

type array []any

// readOrdered reads one value; its recursion is bounded by the jsondepth.Check of reorderJSON.
func readOrdered(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		var o object
		for dec.More() {
			nt, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := readOrdered(dec)
			if err != nil {
				return nil, err
			}
			o = append(o, member{nt.(string), v})
		}
		_, err := dec.Token()
		return o, err
	case json.Delim('['):
		a := array{}
		for dec.More() {
			v, err := readOrdered(dec)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err := dec.Token()
		return a, err
	}
	return tok, nil
}

func writeReordered(w *bytes.Buffer, v any, indent string) error {
	switch x := v.(type) {
	case object:
		w.WriteString("{")
		for i := len(x) - 1; i >= 0; i-- {
			w.WriteString("\n" + indent)
			if err := writeScalar(w, x[i].name); err != nil {
				return err
			}
			w.WriteString(" :  ")
			if err := writeReordered(w, x[i].value, indent+"  "); err != nil {
				return err
			}
			if i > 0 {
				w.WriteString(" ,")
			}
		}
		w.WriteString("\n" + indent[:len(indent)-2] + "}")
	case array:
		w.WriteString("[ ")
		for i, e := range x {
			if i > 0 {
				w.WriteString(" , ")
			}
			if err := writeReordered(w, e, indent+"  "); err != nil {
				return err
			}
		}
		w.WriteString(" ]")
	default:
		return writeScalar(w, x)
	}
	return nil
}

func writeScalar(w *bytes.Buffer, v any) error {
	if n, ok := v.(json.Number); ok {
		w.WriteString(n.String()) // as written: 1.50 stays 1.50
		return nil
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	w.Truncate(w.Len() - 1) // Encode's newline
	return nil
}
