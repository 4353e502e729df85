package conformance

import (
	"encoding/xml"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"
)

// escapeControls writes every rune a terminal or a log viewer could act on as a Go escape (\x1b, \a, \n, \u009b,
// \u202e; a byte that is not UTF-8 as \xff). Evidence quotes what the target answered, and a hostile target's ESC,
// OSC, BEL or bidirectional override must reach the reader as text, never as a command to the terminal; a newline
// or a tab would also break the table. Printable text, spaces included, is kept as it is.
func escapeControls(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, func(c rune) bool { return !strconv.IsPrint(c) }) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		c, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case strconv.IsPrint(c):
			b.WriteRune(c)
		default:
			q := strconv.QuoteRune(c)
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}

// WriteTable prints the report for a person: one line per case with its verdict, time and evidence. Every string
// is passed through escapeControls on the way out.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "retrysafe conformance: %s at %s\n\n", escapeControls(r.Write), escapeControls(r.Target))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CASE\tVERDICT\tTIME\tEVIDENCE")
	for _, res := range r.Results {
		ev := res.Evidence
		if len(ev) == 0 {
			ev = []string{""}
		}
		fmt.Fprintf(tw, "%d %s\t%s\t%s\t%s\n", res.Case, escapeControls(res.Name), escapeControls(string(res.Verdict)),
			seconds(res.Duration), escapeControls(ev[0]))
		for _, e := range ev[1:] {
			fmt.Fprintf(tw, "\t\t\t%s\n", escapeControls(e))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var pass, fail, errs, skip int
	for _, res := range r.Results {
		switch res.Verdict {
		case Pass:
			pass++
		case NotChecked:
			skip++
		case Fail:
			fail++
		default:
			errs++
		}
	}
	outcome := "PASS"
	if !r.Passed() {
		outcome = "FAIL"
	}
	could := ""
	if errs > 0 {
		could = fmt.Sprintf(", %d could not run", errs)
	}
	_, err := fmt.Fprintf(w, "\n%s: %d passed, %d failed%s, %d not checked (%s)\n", outcome, pass, fail, could, skip, seconds(r.Elapsed))
	return err
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name      string      `xml:"name,attr"`
	Tests     int         `xml:"tests,attr"`
	Failures  int         `xml:"failures,attr"`
	Errors    int         `xml:"errors,attr"`
	Skipped   int         `xml:"skipped,attr"`
	Time      string      `xml:"time,attr"`
	Timestamp string      `xml:"timestamp,attr"`
	Cases     []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Error     *junitMessage `xml:"error,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

// WriteJUnit writes the report as JUnit XML, which CI systems read: a failed case is a failure, a case that
// could not run an error, and a case not checked is skipped (never passed). Strings pass through escapeControls,
// as in WriteTable: CI logs and pages show them to a person too.
func (r *Report) WriteJUnit(w io.Writer) error {
	write := escapeControls(r.Write)
	s := junitSuite{
		Name: "retrysafe conformance: " + write, Tests: len(r.Results),
		Time: fmt.Sprintf("%.3f", r.Elapsed.Seconds()), Timestamp: r.Started.UTC().Format(time.RFC3339),
	}
	for _, res := range r.Results {
		ev := make([]string, len(res.Evidence))
		for i, e := range res.Evidence {
			ev[i] = escapeControls(e)
		}
		evidence := strings.Join(ev, "\n")
		first := ""
		if len(ev) > 0 {
			first = ev[0]
		}
		jc := junitCase{
			Name: fmt.Sprintf("%d %s", res.Case, escapeControls(res.Name)), Classname: "conformance." + write,
			Time: fmt.Sprintf("%.3f", res.Duration.Seconds()),
		}
		switch res.Verdict {
		case Pass:
			jc.SystemOut = evidence
		case NotChecked:
			s.Skipped++
			jc.Skipped = &junitMessage{Message: "not checked: " + first, Text: evidence}
		case Fail:
			s.Failures++
			jc.Failure = &junitMessage{Message: failureMessage(ev), Text: evidence}
		default:
			s.Errors++
			jc.Error = &junitMessage{Message: failureMessage(ev), Text: evidence}
		}
		s.Cases = append(s.Cases, jc)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(junitSuites{Suites: []junitSuite{s}}); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// failureMessage is the evidence lines joined, short enough for a CI summary.
func failureMessage(ev []string) string {
	return truncate(strings.Join(ev, "; "), 300)
}
