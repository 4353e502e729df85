// Package httpjson is the JSON of retrysafe's HTTP bodies, both ways, on plain net/http: request bodies decoded
// strictly (one reading of a body, so the fingerprint, an approver's summary and the write see the same
// request) and JSON answers written with one media type. Core packages and adopters use it directly; gin
// handlers pass c.Request and c.Writer.
//
//	var cmd CreateTicket
//	if err := httpjson.DecodeCommand(r, &cmd); err != nil { // 400/415/413/422 problems, before any claim
//		problem.Write(w, r, err)
//		return
//	}
//	httpjson.Write(w, r, http.StatusOK, ticket)
package httpjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"unicode/utf8"

	"github.com/retrysafe/retrysafe/pkg/jsondepth"
	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Write answers v as JSON with status. Every JSON answer of retrysafe, stored, replayed or written here, says
// Content-Type: application/json, without a charset parameter (JSON is UTF-8; RFC 8259 defines no charset), so
// a client sees one media type for every answer. A value that cannot be encoded is answered as a problem.
func Write(w http.ResponseWriter, r *http.Request, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		problem.Write(w, r, fmt.Errorf("httpjson: encode the answer: %w", err))
		return
	}
	w.Header()["Content-Type"] = []string{"application/json"}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// DecodeJSON reads the request body into v strictly (see DecodeBytes): a JSON object, no unknown, duplicate
// or case-folded member names, no trailing data, types as declared: 400 invalid_request otherwise; a number that
// RFC 8785 would write as another (beyond what a double holds exactly) is 422 validation_failed naming it. Both
// before anything is claimed or stored.
func Decode(r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && mt != "application/problem+json") {
			return problem.New("unsupported_media_type", "send Content-Type: application/json")
		}
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return problem.New("body_too_large", "request body is larger than %d bytes", tooLarge.Limit)
		}
		return problem.New("invalid_request", "could not read the request body")
	}
	return DecodeBytes(body, v)
}

// DecodeBytes is Decode for a body already read, such as the proposed body of an approval request, so
// that it is held to exactly the rules its write will be. Strict means: nested at most jsondepth.Max levels,
// UTF-8, one JSON value, no unknown member, no member twice in one object, no name that matches a field only
// by case, no escape of half a surrogate pair, at any depth; so what is decoded is the only way to read the
// body, and the fingerprint, an approver's summary and the write all see the same request. A body nested
// deeper is refused before it is walked, after one pass over at most its bytes.
func DecodeBytes(body []byte, v any) error {
	if trimmed := bytes.TrimSpace(body); len(trimmed) == 0 || trimmed[0] != '{' {
		return problem.New("invalid_request", "the request body must be a JSON object")
	}
	if err := jsondepth.Check(body); err != nil {
		return problem.New("invalid_request", "malformed JSON: %v", err)
	}
	if !utf8.Valid(body) {
		return problem.New("invalid_request", "malformed JSON: the body is not valid UTF-8")
	}
	if err := checkMemberNames(body, reflect.TypeOf(v)); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return problem.New("invalid_request", "malformed JSON: %s", describeJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return problem.New("invalid_request", "malformed JSON: data after the JSON object")
	}
	return nil
}

// DecodeAction is the one rule for the body of an action endpoint (cancel, capture, rollback, approve,
// deny), whose fields are all optional: an empty body (no bytes, or only white space) means {}; any other body
// is decoded strictly into v as Decode does, so `{"x":1}` is 400 invalid_request like an unknown field
// anywhere. An action without fields decodes into a struct{}.
func DecodeAction(r *http.Request, v any) error {
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return Decode(r, v) // reports the read error as Decode does
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return Decode(r, v)
}

// DecodeActionCommand is DecodeAction, then cmd.Validate (defaults apply to an empty body too).
func DecodeActionCommand(r *http.Request, cmd Command) error {
	if err := DecodeAction(r, cmd); err != nil {
		return err
	}
	return cmd.Validate()
}

// Command is a request body that can check itself and apply its defaults.
type Command interface{ Validate() error }

// DecodeCommand decodes the body strictly into cmd, then validates it: both before any idempotency claim, so
// a refused request never burns its key.
func DecodeCommand(r *http.Request, cmd Command) error {
	if err := Decode(r, cmd); err != nil {
		return err
	}
	return cmd.Validate()
}

func describeJSONError(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		if typeErr.Field != "" {
			return fmt.Sprintf("field %q must be %s", typeErr.Field, typeErr.Type.String())
		}
		return "the request body must be a JSON object"
	}
	var syntaxErr *json.SyntaxError
	if errors.As(err, &syntaxErr) {
		return fmt.Sprintf("syntax error at byte %d", syntaxErr.Offset)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return "unexpected end of input"
	}
	// json reports unknown fields as `json: unknown field "x"`; that text names the field and nothing private.
	return err.Error()
}
