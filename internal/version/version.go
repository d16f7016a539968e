// Package version says which build of vmss-autoscaler is running: the
// version and commit stamped at build time with -ldflags (make image does),
// or, when not stamped, what the Go toolchain recorded in the binary.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Stamped at build time, never changed at run time:
//
//	go build -ldflags "-X github.com/vmss-autoscaler/vmss-autoscaler/internal/version.version=0.1.0 \
//	  -X github.com/vmss-autoscaler/vmss-autoscaler/internal/version.commit=$(git rev-parse HEAD)"
//
// -X can only set package-level string variables, hence these two.
var (
	version string
	commit  string
)

// Unknown is the version or commit of a build that recorded neither.
const Unknown = "unknown"

// Info describes a build.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// String is the line `vmss-autoscaler --version` prints.
func (i Info) String() string {
	return fmt.Sprintf("vmss-autoscaler %s (commit %s, %s, %s)", i.Version, i.Commit, i.GoVersion, i.Platform)
}

// Get returns this binary's build information.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(version, commit, bi)
}

// resolve picks the stamped values and falls back on the build info: the
// module version (set by `go install module@version`, or from a VCS tag)
// and the vcs.revision setting (builds from a git checkout with VCS
// stamping on), "-dirty" when the tree was modified.
func resolve(stampedVersion, stampedCommit string, bi *debug.BuildInfo) Info {
	info := Info{Version: stampedVersion, Commit: stampedCommit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi != nil {
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
		if info.Version == "" {
			info.Version = moduleVersion(bi)
		}
		if info.Commit == "" {
			info.Commit = vcsCommit(bi)
		}
	}
	if info.Version == "" {
		info.Version = "devel"
	}
	if info.Commit == "" {
		info.Commit = Unknown
	}
	return info
}

// moduleVersion is the main module's version without its "v", empty for
// a build of a checkout ("(devel)").
func moduleVersion(bi *debug.BuildInfo) string {
	if bi.Main.Version == "" || bi.Main.Version == "(devel)" {
		return ""
	}
	return strings.TrimPrefix(bi.Main.Version, "v")
}

// vcsCommit is the revision the build recorded, "-dirty" when the work
// tree was modified; empty when it recorded none.
func vcsCommit(bi *debug.BuildInfo) string {
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" && dirty {
		rev += "-dirty"
	}
	return rev
}

// LDFlags returns the -X flags that stamp version and commit into a build
// of this module.
func LDFlags(version, commit string) string {
	const pkg = "github.com/vmss-autoscaler/vmss-autoscaler/internal/version"
	return fmt.Sprintf("-X %s.version=%s -X %s.commit=%s", pkg, version, pkg, commit)
}
