package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"strings"
	"time"
)

var funcs = template.FuncMap{
	// service is the service an operation belongs to: the first word of its kind ("payments.capture").
	"service": func(kind string) string {
		name, _, _ := strings.Cut(kind, ".")
		return name
	},
	"time": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05 UTC")
	},
	"timep": func(t *time.Time) string {
		if t == nil {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05 UTC")
	},
	"str": func(s *string) string {
		if s == nil {
			return "—"
		}
		return *s
	},
	"int": func(v any) string {
		switch v := v.(type) {
		case *int:
			if v != nil {
				return fmt.Sprint(*v)
			}
		case *int64:
			if v != nil {
				return fmt.Sprint(*v)
			}
		}
		return ""
	},
	// pretty indents a JSON document for reading; the text is escaped by the template like any other.
	"pretty": func(raw any) string {
		var b []byte
		switch v := raw.(type) {
		case string:
			b = []byte(v)
		case json.RawMessage:
			b = v
		default:
			return fmt.Sprint(v)
		}
		var out bytes.Buffer
		if json.Indent(&out, b, "", "  ") != nil {
			return string(b)
		}
		return out.String()
	},
	// pending pairs an inbox item with the session, for the "pending" template (approvals.html).
	"pending": func(it pendingItem, s Session) map[string]any {
		return map[string]any{"Item": it, "Session": s}
	},
	"until": func(t time.Time) string {
		d := time.Until(t).Round(time.Minute)
		if d <= 0 {
			return "expired"
		}
		return "in " + d.String()
	},
}
