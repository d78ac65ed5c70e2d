package main

import (
	"testing"
	"time"
)

func TestIsPackageLine(t *testing.T) {
	cases := []struct {
		reason string
		line   string
		want   bool
	}{
		{reason: "an import path", line: "k8s.io/apiserver/pkg/server", want: true},
		{reason: "a main package", line: "go.etcd.io/etcd/server/v3", want: true},
		{reason: "build.sh's announcement", line: "building kubernetes v1.36.3 control plane into /x (first time on this machine: ~5-8 min)"},
		{reason: "build.sh's result", line: "built in 412s"},
		{reason: "a compiler error", line: "k8s.io/x/y.go:12:3: undefined: z"},
		{reason: "a go command note", line: "# k8s.io/x"},
		{reason: "a standard-library package is named without a slash only when it has none", line: "fmt"},
		{reason: "empty", line: ""},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if got := isPackageLine(c.line); got != c.want {
				t.Errorf("isPackageLine(%q) = %v, want %v", c.line, got, c.want)
			}
		})
	}
}

func TestProgressLine(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		reason string
		p      progress
		at     time.Duration
		want   string
	}{
		{reason: "before the total is known", p: progress{start: start, compiled: 12, last: "k8s.io/a"}, at: 30 * time.Second,
			want: "building: 30s elapsed, 12 packages compiled; last: k8s.io/a"},
		{reason: "with the total: what is left and a rough time", p: progress{start: start, compiled: 500, total: 2000, last: "k8s.io/b"}, at: 2 * time.Minute,
			want: "building: 2m0s elapsed, 500 of 2000 packages compiled, 1500 left (about 6m0s more); last: k8s.io/b"},
		{reason: "more compiled than counted stale (the count raced the build)", p: progress{start: start, compiled: 2100, total: 2000}, at: 8 * time.Minute,
			want: "building: 8m0s elapsed, 2000 of 2000 packages compiled, 0 left"},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if got := c.p.line(start.Add(c.at)); got != c.want {
				t.Errorf("line = %q\nwant   %q", got, c.want)
			}
		})
	}
}
