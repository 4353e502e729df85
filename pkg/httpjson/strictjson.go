package httpjson

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// checkMemberNames refuses what encoding/json lets through silently and a second reader of the same body may
// read another way: a member name that appears twice in one object (encoding/json keeps the last, another
// parser the first), and a name that matches a field only as encoding/json folds names (bytes.EqualFold:
// "AMOUNT" for amount, "ſervice" with U+017F for service). It walks body beside t, the type the body decodes
// into, at any depth; inside values whose type it cannot see into (json.RawMessage, any, custom unmarshalers)
// it still refuses duplicates. The walk reads with jsontext, which refuses what RFC 8259 leaves open and
// encoding/json would turn into U+FFFD: a \u escape of half a surrogate pair ("\ud800"), so two different
// strings cannot be stored as one.
//
// On the same walk it refuses, 422 validation_failed naming the member, a number that RFC 8785 would not keep
// (auditchain.ExactNumber: 2^53+1, the int64 maximum, 1e400): what a request carries reaches records and
// approvals, which hold numbers as IEEE 754 doubles, so such a number would be recorded, shown to an approver
// and hashed as another one. A whole number an integer field cannot hold (1e23, 10^19 in an int64) is the
// same answer: it too is a value the field cannot carry, however it is written.
//
// The caller has bounded the depth (jsondepth.Check), so the walk's recursion is bounded; a member's path is
// written out only for a refusal, so the walk costs memory in proportion to the body.
func checkMemberNames(body []byte, t reflect.Type) error {
	w := walker{dec: jsontext.NewDecoder(bytes.NewReader(body), jsontext.AllowDuplicateNames(true))}
	return w.value(t)
}

type walker struct {
	dec  *jsontext.Decoder
	path []pathStep // where the walk is: the member names and array indexes above the value it reads
}

// pathStep is one step of a member's path: a name, or an index when isIndex.
type pathStep struct {
	name    string
	index   int
	isIndex bool
}

// at writes the path as errors[].field names members: "lines[1].sku".
func (w *walker) at() string {
	var b strings.Builder
	for _, s := range w.path {
		switch {
		case s.isIndex:
			b.WriteString("[" + strconv.Itoa(s.index) + "]")
		case b.Len() > 0:
			b.WriteString("." + s.name)
		default:
			b.WriteString(s.name)
		}
	}
	return b.String()
}

// value reads one value of type t.
func (w *walker) value(t reflect.Type) error {
	tok, err := w.dec.ReadToken()
	if err != nil {
		return w.syntaxError(err)
	}
	t = opaque(t)
	switch tok.Kind() {
	case '{':
		err = w.object(t)
	case '[':
		err = w.array(t)
	case '0':
		return w.number(tok.String(), t)
	default:
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := w.dec.ReadToken(); err != nil { // the '}' or ']'
		return w.syntaxError(err)
	}
	return nil
}

// object reads the members of an object of type t, up to its '}': each name once, and each field's name as
// the field spells it.
func (w *walker) object(t reflect.Type) error {
	fields := fieldsOf(t)
	var elem reflect.Type
	if t != nil && t.Kind() == reflect.Map {
		elem = t.Elem()
	}
	seen := map[string]bool{}
	for w.dec.PeekKind() != '}' {
		tok, err := w.dec.ReadToken()
		if err != nil {
			return w.syntaxError(err)
		}
		name := tok.String()
		w.path = append(w.path, pathStep{name: name})
		if seen[name] {
			return w.nameError("appears more than once in one object")
		}
		seen[name] = true
		next := elem
		if fields != nil {
			if ft, exact := fields.exact[name]; exact {
				next = ft
			} else if canonical, folded := fields.folded(name); folded {
				return w.nameError(fmt.Sprintf("matches the field %q only by case; names are case-sensitive", canonical))
			}
		}
		if err := w.value(next); err != nil {
			return err
		}
		w.path = w.path[:len(w.path)-1]
	}
	return nil
}

// array reads the elements of an array of type t, up to its ']'.
func (w *walker) array(t reflect.Type) error {
	var elem reflect.Type
	if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
		elem = t.Elem()
	}
	for i := 0; w.dec.PeekKind() != ']'; i++ {
		w.path = append(w.path, pathStep{index: i, isIndex: true})
		if err := w.value(elem); err != nil {
			return err
		}
		w.path = w.path[:len(w.path)-1]
	}
	return nil
}

// number refuses a number that RFC 8785 would write as another, and a whole number beyond the range of the
// integer type t. A fraction in an integer field is left to the decoder, which refuses it as the wrong type.
func (w *walker) number(text string, t reflect.Type) error {
	if !auditchain.ExactNumber(text) {
		return problem.Validation(problem.FieldError{Field: w.at(),
			Message: "is a number JSON cannot carry exactly (RFC 8785 keeps numbers as IEEE 754 doubles): send integers within ±9007199254740992 and decimals of at most 15 significant digits"})
	}
	if t == nil {
		return nil
	}
	var lo, hi float64 // the type's range, [lo, hi)
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		lo, hi = -math.Ldexp(1, t.Bits()-1), math.Ldexp(1, t.Bits()-1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		lo, hi = 0, math.Ldexp(1, t.Bits())
	default:
		return nil
	}
	// An exact number is within a double's range, and a double beyond 2^53 is whole.
	f, _ := strconv.ParseFloat(text, 64)
	if f == math.Trunc(f) && (f < lo || f >= hi) {
		return problem.Validation(problem.FieldError{Field: w.at(),
			Message: fmt.Sprintf("is out of range: send an integer from %.0f to %.0f", lo, hi-1)})
	}
	return nil
}

// syntaxError is a read error of the walk as a problem: what is not JSON, and what RFC 8259 allows but no
// two readers agree on (a lone surrogate escape), is 400 naming the member it is in.
func (w *walker) syntaxError(err error) error {
	detail := "unexpected end of input"
	var syntax *jsontext.SyntacticError
	if errors.As(err, &syntax) && !errors.Is(err, io.ErrUnexpectedEOF) {
		// jsontext's messages quote at most a few bytes of the input, with control characters escaped.
		detail = fmt.Sprintf("%v at byte %d", syntax.Err, syntax.ByteOffset)
	}
	pe := &problem.Error{Code: "invalid_request", Detail: "malformed JSON: " + detail}
	if at := w.at(); at != "" {
		pe.Fields = []problem.FieldError{{Field: at, Message: "is not valid JSON: " + detail}}
	}
	return pe
}

func (w *walker) nameError(message string) *problem.Error {
	member := w.at()
	return &problem.Error{
		Code:   "invalid_request",
		Detail: fmt.Sprintf("malformed JSON: member %q %s", member, message),
		Fields: []problem.FieldError{{Field: member, Message: message}},
	}
}

var (
	unmarshalerType     = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// opaque dereferences t and returns nil for types whose members this walk cannot know: interfaces and types
// that decode themselves.
func opaque(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() == reflect.Interface {
		return nil
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) || reflect.PointerTo(t).Implements(textUnmarshalerType) {
		return nil
	}
	return t
}

type structFields struct {
	exact map[string]reflect.Type // JSON name -> field type
	names []string                // the JSON names, for folded
}

// folded returns the field name encoding/json would match name to although it is not that name: the first
// equal under bytes.EqualFold, which is how encoding/json compares names.
func (f *structFields) folded(name string) (string, bool) {
	for _, n := range f.names {
		if strings.EqualFold(n, name) {
			return n, true
		}
	}
	return "", false
}

var fieldCache sync.Map // reflect.Type -> *structFields

// fieldsOf lists the JSON members of a struct type as encoding/json names them, embedded structs included;
// nil for any other type.
func fieldsOf(t reflect.Type) *structFields {
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	if f, ok := fieldCache.Load(t); ok {
		return f.(*structFields)
	}
	f := &structFields{exact: map[string]reflect.Type{}}
	addFields(f, t)
	fieldCache.Store(t, f)
	return f
}

func addFields(f *structFields, t reflect.Type) {
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if sf.Anonymous && name == "" {
			et := sf.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				addFields(f, et)
				continue
			}
		}
		if !sf.IsExported() {
			continue
		}
		if name == "" {
			name = sf.Name
		}
		f.exact[name] = sf.Type
		f.names = append(f.names, name)
	}
}
