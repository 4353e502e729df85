// Package jsondepth bounds how deeply a JSON text nests, before a decoder reads it.
//
// encoding/json and jsontext keep a frame for every level of nesting and stop only at 10,000 levels, and code
// that walks a decoded value recursively pays for every level again: 100,000 '[' are 100 KB of input. Check
// counts the levels in one pass over the bytes, in constant memory, and stops at the first byte past Max, so
// refusing a deep text costs at most its size. It does not otherwise validate JSON; the decoder that follows
// does.
//
//	if err := jsondepth.Check(body); err != nil {
//		return err // wraps ErrTooDeep
//	}
//	err := json.Unmarshal(body, &v)
//
// retrysafe puts Check (or Reader, for a stream) in front of every JSON it reads from outside: request bodies,
// MCP messages and tool arguments, tools files, audit bundles, conformance specs.
package jsondepth

import (
	"fmt"
	"io"
)

// Max is how many levels of arrays and objects may nest: `{}` is one level, `{"a":[1]}` two. retrysafe's own
// documents need fewer than ten (an audit bundle, the deepest, about eight).
const Max = 64

// ErrTooDeep is the error Check and Reader wrap for a text that nests deeper than Max.
var ErrTooDeep = fmt.Errorf("JSON nests deeper than %d levels", Max)

// Check returns an error wrapping ErrTooDeep if data nests arrays and objects deeper than Max.
func Check(data []byte) error {
	var s scanner
	if i := s.scan(data); i >= 0 {
		return tooDeep(int64(i))
	}
	return nil
}

// Reader returns a reader of r's bytes that fails, with an error wrapping ErrTooDeep, at the first byte that
// nests deeper than Max; the bytes before it are read as they are.
func Reader(r io.Reader) io.Reader {
	return &reader{r: r}
}

type reader struct {
	r    io.Reader
	s    scanner
	read int64
	err  error
}

func (r *reader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	n, err := r.r.Read(p)
	if i := r.s.scan(p[:n]); i >= 0 {
		r.err = tooDeep(r.read + int64(i))
		return i, r.err
	}
	r.read += int64(n)
	return n, err
}

// scanner follows the nesting of a JSON text byte by byte: brackets count only outside strings.
type scanner struct {
	depth             int
	inString, escaped bool
}

// scan reads p and returns the index of the first byte that opens level Max+1, or -1.
func (s *scanner) scan(p []byte) int {
	for i, ch := range p {
		switch {
		case s.inString:
			switch {
			case s.escaped:
				s.escaped = false
			case ch == '\\':
				s.escaped = true
			case ch == '"':
				s.inString = false
			}
		case ch == '"':
			s.inString = true
		case ch == '[' || ch == '{':
			if s.depth++; s.depth > Max {
				return i
			}
		case ch == ']' || ch == '}':
			// A closer too many is the decoder's to refuse; it must not buy an opener more.
			s.depth = max(s.depth-1, 0)
		}
	}
	return -1
}

func tooDeep(offset int64) error {
	return fmt.Errorf("%w (at byte %d)", ErrTooDeep, offset)
}
