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

// Short is the build's version in one word: Version, or "devel" with the VCS revision when the
// toolchain recorded one ("devel+0123456789ab"). The HTTP API's OpenAPI document carries it.
func Short() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				return "devel+" + s.Value[:min(len(s.Value), 12)]
			}
		}
	}
	return "devel"
}
