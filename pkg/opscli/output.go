// Package opscli is the logic of the metabus operator subcommands (status,
// dlq, tail, explain): it reads what the bus and the cluster hold, turns it
// into summaries with pure functions, and prints them as kubectl and the
// nats CLI do: human tables by default, JSON or YAML on request. The cobra
// commands in cmd/metabus only parse flags, connect, and call it.
package opscli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"
)

// InboxPrefix is the reply-subject prefix of the operator users' NATS
// connections (natsx.ServiceInboxPrefix("operator")): like each service,
// they may subscribe to their own inbox only.
const InboxPrefix = "_INBOX_operator"

// Exit codes of the operator subcommands, for scripts.
const (
	// ExitOK: done, nothing to report.
	ExitOK = 0
	// ExitError: the operation failed (connection, permission, API error,
	// a hook call that failed).
	ExitError = 1
	// ExitUsage: bad flags or arguments.
	ExitUsage = 2
	// ExitNotFound: the object asked about (parent, controller, DLQ
	// entry) does not exist.
	ExitNotFound = 3
	// ExitDiffers: render found that the desired state differs from the
	// given or live state (as diff(1) and kubectl diff report
	// differences).
	ExitDiffers = 4
)

// ExitCodeError is an error with the exit code it calls for.
type ExitCodeError struct {
	Code int
	Err  error
}

func (e *ExitCodeError) Error() string { return e.Err.Error() }
func (e *ExitCodeError) Unwrap() error { return e.Err }

// ExitCode is the exit code the error calls for (pkg/cli's Run exits with
// it).
func (e *ExitCodeError) ExitCode() int { return e.Code }

// NotFound wraps err with ExitNotFound.
func NotFound(format string, a ...any) error {
	return &ExitCodeError{Code: ExitNotFound, Err: fmt.Errorf(format, a...)}
}

// Usage wraps err with ExitUsage.
func Usage(format string, a ...any) error {
	return &ExitCodeError{Code: ExitUsage, Err: fmt.Errorf(format, a...)}
}

// Code is the exit code of err (nil: ExitOK).
func Code(err error) int {
	if err == nil {
		return ExitOK
	}
	var e *ExitCodeError
	if errors.As(err, &e) {
		return e.Code
	}
	return ExitError
}

// Format is an output format: "table" (default), "json" or "yaml".
type Format string

// Output formats.
const (
	Table Format = "table"
	JSON  Format = "json"
	YAML  Format = "yaml"
)

// ParseFormat checks an -o value ("" is Table).
func ParseFormat(s string) (Format, error) {
	switch Format(s) {
	case "", Table:
		return Table, nil
	case JSON, YAML:
		return Format(s), nil
	}
	return "", Usage("unknown output format %q: want table, json or yaml", s)
}

// Print writes v as JSON or YAML, or calls table for the human form.
func Print(w io.Writer, f Format, v any, table func(w io.Writer) error) error {
	switch f {
	case JSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case YAML:
		data, err := yaml.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode yaml: %w", err)
		}
		_, err = w.Write(data)
		return err
	default:
		return table(w)
	}
}

// tableWriter writes tab-separated rows as aligned columns.
type tableWriter struct {
	tw *tabwriter.Writer
}

func newTable(w io.Writer, header ...string) *tableWriter {
	t := &tableWriter{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *tableWriter) row(cols ...string) {
	fmt.Fprintln(t.tw, strings.Join(cols, "\t"))
}

func (t *tableWriter) flush() error { return t.tw.Flush() }

// Age formats a duration the way kubectl prints ages: 45s, 3m12s, 5h3m,
// 2d4h; "-" for zero.
func Age(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	d = d.Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 10*time.Minute:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

// dash prints "-" for an empty string.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// count prints a number, "-" when unknown (negative).
func count[T int | int64 | uint64](n T) string {
	if n < 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

// truncate shortens s to n runes with an ellipsis, on one line.
func truncate(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }
