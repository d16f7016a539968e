package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	tests := []struct {
		name                    string
		version, commit         string
		bi                      *debug.BuildInfo
		wantVersion, wantCommit string
	}{
		{"stamped wins", "0.2.0", "abc123", &debug.BuildInfo{Main: debug.Module{Version: "v9.9.9"}, Settings: vcs("fff", "false")}, "0.2.0", "abc123"},
		{"go install module@version", "", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.3.1"}}, "0.3.1", Unknown},
		{"local build from git", "", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("0123abcd", "false")}, "devel", "0123abcd"},
		{"modified tree", "", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("0123abcd", "true")}, "devel", "0123abcd-dirty"},
		{"no build info", "", "", nil, "devel", Unknown},
		{"version stamped, commit from VCS", "1.0.0", "", &debug.BuildInfo{Settings: vcs("beef", "false")}, "1.0.0", "beef"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := resolve(tc.version, tc.commit, tc.bi)
			if got.Version != tc.wantVersion || got.Commit != tc.wantCommit {
				t.Fatalf("resolve = %+v, want version %q commit %q", got, tc.wantVersion, tc.wantCommit)
			}
			if got.GoVersion == "" || !strings.Contains(got.Platform, "/") {
				t.Errorf("go version %q, platform %q", got.GoVersion, got.Platform)
			}
			if s := got.String(); !strings.HasPrefix(s, "vmss-autoscaler "+tc.wantVersion+" (commit "+tc.wantCommit) {
				t.Errorf("String() = %q", s)
			}
		})
	}
}

func TestLDFlags(t *testing.T) {
	got := LDFlags("0.1.0", "abc")
	want := "-X github.com/vmss-autoscaler/vmss-autoscaler/internal/version.version=0.1.0 -X github.com/vmss-autoscaler/vmss-autoscaler/internal/version.commit=abc"
	if got != want {
		t.Fatalf("LDFlags = %q, want %q", got, want)
	}
}
