package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vmss-autoscaler/vmss-autoscaler/internal/image"
)

// TestRunRejectsBadUse: errors come before any compiling, and name what is wrong.
func TestRunRejectsBadUse(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.crt")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no subcommand", nil, "want a subcommand: build or push"},
		{"unknown subcommand", []string{"bake"}, `unknown subcommand "bake"`},
		{"stray argument", []string{"build", "now"}, `build: unexpected arguments ["now"]`},
		{"no CA certificates", []string{"build", "--root=../..", "--ca-certificates=" + missing}, "CA certificates " + missing + ": not found"},
		{"bad platform", []string{"build", "--ca-certificates=" + missing, "--platforms=amd64"}, `--platforms: platform "amd64": want os/arch`},
		{"version not a tag", []string{"build", "--root=../..", "--version=1.0+build"}, `--version: version "1.0+build": must be usable as an image tag`},
		{"unreachable preflight base", []string{"build", "--root=../..", "--ca-certificates=" + image.DefaultCACerts, "--preflight-base=127.0.0.1:1/dcgm:4"},
			"--preflight-base: base image 127.0.0.1:1/dcgm:4"},
		{"push without a reference", []string{"push"}, "push: want one image reference"},
		{"push two references", []string{"push", "a/b:1", "c/d:2"}, "push: want one image reference"},
		{"push without a layout", []string{"push", "--layout=" + filepath.Join(t.TempDir(), "oci"), "example.com/a:1"}, "run make image first"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if slices.Contains(tc.args, "--ca-certificates="+image.DefaultCACerts) {
				if _, err := os.Stat(image.DefaultCACerts); err != nil {
					t.Skipf("this machine has no %s", image.DefaultCACerts)
				}
			}
			err := run(context.Background(), tc.args)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}
