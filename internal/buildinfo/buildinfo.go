// Package buildinfo says which build a binary is: what `framepack --version` and
// `framepackd --version` print.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the release version, set at link time
// (-ldflags "-X github.com/framepackd/framepackd/internal/buildinfo.Version=v1.2.3");
// empty in a development build.
var Version string

// String is one line naming the binary's build: the version (or "devel"), the VCS revision
// and time when the Go toolchain recorded them, and the Go version.
func String(binary string) string {
	v := Version
	if v == "" {
		v = "devel"
	}
	rev, when, dirty := "", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	out := fmt.Sprintf("%s %s", binary, v)
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if dirty {
			rev += "+dirty"
		}
		out += " (" + rev
		if when != "" {
			out += ", " + when
		}
		out += ")"
	}
	return out + " " + runtime.Version()
}
