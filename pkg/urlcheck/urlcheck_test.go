package urlcheck_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/retrysafe/retrysafe/pkg/problem"
	"github.com/retrysafe/retrysafe/pkg/urlcheck"
)

// TestRequestReadsTheWildcardsOfItsPattern: behind a ServeMux, Request checks each wildcard of the matched
// pattern (a {name...} one too) and the query, as httpserver.CheckURL checks gin's parameters.
func TestRequestReadsTheWildcardsOfItsPattern(t *testing.T) {
	t.Parallel()
	var got error
	mux := http.NewServeMux()
	mux.HandleFunc("GET /things/{id}/files/{path...}", func(_ http.ResponseWriter, r *http.Request) { got = urlcheck.Request(r) })
	for _, tc := range []struct {
		url  string
		code problem.Code
	}{
		{"/things/t1/files/a/b?q=x", ""},
		{"/things/t%00/files/a", "not_found"},
		{"/things/t1/files/a/%e2%80%ae", "not_found"},
		{"/things/t1/files/a?q=%ff", "invalid_request"},
		{"/things/t1/files/a?q=%zz", "invalid_request"},
	} {
		got = errors.New("not reached")
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, tc.url, nil))
		var p *problem.Error
		switch {
		case tc.code == "" && got != nil:
			t.Errorf("%s: %v; want it clean", tc.url, got)
		case tc.code != "" && (!errors.As(got, &p) || p.Code != tc.code):
			t.Errorf("%s: %v; want %s", tc.url, got, tc.code)
		}
	}
}
