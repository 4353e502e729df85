package conformance

import (
	"encoding/xml"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable prints the report for a person: one line per case with its verdict, time and evidence.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "retrysafe conformance: %s at %s\n\n", r.Write, r.Target)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CASE\tVERDICT\tTIME\tEVIDENCE")
	for _, res := range r.Results {
		ev := res.Evidence
		if len(ev) == 0 {
			ev = []string{""}
		}
		fmt.Fprintf(tw, "%d %s\t%s\t%s\t%s\n", res.Case, res.Name, res.Verdict, seconds(res.Duration), ev[0])
		for _, e := range ev[1:] {
			fmt.Fprintf(tw, "\t\t\t%s\n", e)
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
// could not run an error, and a case not checked is skipped (never passed).
func (r *Report) WriteJUnit(w io.Writer) error {
	s := junitSuite{
		Name: "retrysafe conformance: " + r.Write, Tests: len(r.Results),
		Time: fmt.Sprintf("%.3f", r.Elapsed.Seconds()), Timestamp: r.Started.UTC().Format(time.RFC3339),
	}
	for _, res := range r.Results {
		evidence := strings.Join(res.Evidence, "\n")
		first := ""
		if len(res.Evidence) > 0 {
			first = res.Evidence[0]
		}
		jc := junitCase{
			Name: fmt.Sprintf("%d %s", res.Case, res.Name), Classname: "conformance." + r.Write,
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
			jc.Failure = &junitMessage{Message: failureMessage(res.Evidence), Text: evidence}
		default:
			s.Errors++
			jc.Error = &junitMessage{Message: failureMessage(res.Evidence), Text: evidence}
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
