package httpserver

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// checkMemberNames refuses what encoding/json lets through silently and a second reader of the same body may
// read another way: a member name that appears twice in one object (encoding/json keeps the last, another
// parser the first), and a name that matches a field only by case ("AMOUNT" for amount, which encoding/json
// accepts). It walks body beside t, the type the body decodes into, at any depth; inside values whose type
// it cannot see into (json.RawMessage, any, custom unmarshalers) it still refuses duplicates. A body that is
// not JSON passes here and is refused by the decoder.
//
// On the same walk it refuses, 422 validation_failed naming the member, a number that RFC 8785 would not keep
// (auditchain.ExactNumber: 2^53+1, the int64 maximum, 1e400): what a request carries reaches records and
// approvals, which hold numbers as IEEE 754 doubles, so such a number would be recorded, shown to an approver
// and hashed as another one.
func checkMemberNames(body []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	_, err := walkJSON(dec, t, "")
	return err
}

// walkJSON reads one value; ok is false when the input ends or is not JSON (the decoder reports that).
func walkJSON(dec *json.Decoder, t reflect.Type, at string) (ok bool, err error) {
	tok, err := dec.Token()
	if err != nil {
		return false, nil
	}
	t = opaque(t)
	switch tok {
	case json.Delim('{'):
		fields := fieldsOf(t)
		var elem reflect.Type
		if t != nil && t.Kind() == reflect.Map {
			elem = t.Elem()
		}
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return false, nil
			}
			name, _ := tok.(string)
			member := memberPath(at, name)
			if seen[name] {
				return false, nameError(member, "appears more than once in one object")
			}
			seen[name] = true
			next := elem
			if fields != nil {
				if ft, exact := fields.exact[name]; exact {
					next = ft
				} else if canonical, folded := fields.folded[strings.ToLower(name)]; folded {
					return false, nameError(member, fmt.Sprintf("matches the field %q only by case; names are case-sensitive", canonical))
				}
			}
			if ok, err := walkJSON(dec, next, member); !ok || err != nil {
				return ok, err
			}
		}
		_, err := dec.Token()
		return err == nil, nil
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if ok, err := walkJSON(dec, elem, fmt.Sprintf("%s[%d]", at, i)); !ok || err != nil {
				return ok, err
			}
		}
		_, err := dec.Token()
		return err == nil, nil
	}
	if n, ok := tok.(json.Number); ok && !auditchain.ExactNumber(n.String()) {
		return false, problem.Validation(problem.FieldError{Field: at,
			Message: "is a number JSON cannot carry exactly (RFC 8785 keeps numbers as IEEE 754 doubles): send integers within ±9007199254740992 and decimals of at most 15 significant digits"})
	}
	return true, nil
}

func memberPath(at, name string) string {
	if at == "" {
		return name
	}
	return at + "." + name
}

func nameError(member, message string) *problem.Error {
	return &problem.Error{
		Code:   problem.CodeInvalidRequest,
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
	exact  map[string]reflect.Type // JSON name -> field type
	folded map[string]string       // lower-case JSON name -> JSON name
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
	f := &structFields{exact: map[string]reflect.Type{}, folded: map[string]string{}}
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
		f.folded[strings.ToLower(name)] = name
	}
}
