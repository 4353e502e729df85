// Package urlcheck holds what a URL may carry to the rule every route of retrysafe keeps: path parameters and
// query values that are not UTF-8 text without control, bidirectional or zero-width characters are refused
// before a handler reads them, so no byte sequence from a URL can reach SQL (PostgreSQL refuses NUL and invalid
// UTF-8 with SQLSTATE 22021, which would be a 500). It speaks net/http; httpserver.CheckURL applies it to
// every gin route of the API, the console to its pages.
//
//	if err := urlcheck.Request(r); err != nil {
//		problem.Write(w, r, err) // 404 for a bad path parameter, 400 for a bad query
//		return
//	}
package urlcheck

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/retrysafe/retrysafe/pkg/problem"
)

// Limits on what a URL may carry. Ids are 40-odd characters and names at most 63; nothing a route takes comes
// near these, so only a hostile or broken caller meets them.
const (
	MaxPathParamLength  = 255
	MaxQueryValueLength = 1024
)

// Param is one path parameter of a request: its name in the route template and its value.
type Param struct{ Name, Value string }

// Request checks the path parameters of r (the wildcards of its ServeMux pattern) and its query string (Check).
func Request(r *http.Request) error {
	_, route, _ := strings.Cut(r.Pattern, " ")
	var params []Param
	for segment := range strings.SplitSeq(route, "/") { // a wildcard is a whole segment: {name}, {name...} or {$}
		if name, ok := strings.CutPrefix(segment, "{"); ok && name != "$}" {
			name = strings.TrimSuffix(strings.TrimSuffix(name, "}"), "...")
			params = append(params, Param{name, r.PathValue(name)})
		}
	}
	return Check(params, r.URL.RawQuery)
}

// Check checks path parameters and a raw query string: a bad path parameter names nothing that can exist, a
// not_found problem, as a missing resource; a bad query is invalid_request naming the parameter. The problem
// never quotes the value, so neither an answer nor a log line carries it.
func Check(params []Param, rawQuery string) error {
	for _, p := range params {
		if len(p.Value) > MaxPathParamLength || problem.TextFault(p.Value, false) != "" {
			return problem.New("not_found", "nothing is found at this path: the %s is malformed", p.Name)
		}
	}
	if rawQuery == "" {
		return nil
	}
	query, err := url.ParseQuery(rawQuery)
	if err != nil {
		return problem.New("invalid_request", "the query string is malformed: send name=value pairs separated by & and percent-encoded")
	}
	for name, values := range query {
		if len(name) > MaxQueryValueLength || problem.TextFault(name, false) != "" {
			return problem.New("invalid_request", "a query parameter name is not UTF-8 text without control characters")
		}
		for _, v := range values {
			if len(v) > MaxQueryValueLength {
				return problem.New("invalid_request", "query parameter %q is longer than %d bytes", name, MaxQueryValueLength)
			}
			if fault := problem.TextFault(v, false); fault != "" {
				return problem.New("invalid_request", "query parameter %q %s", name, fault)
			}
		}
	}
	return nil
}
