// Package buildinfo says which build a binary is: what `framepack --version` and
// `framepackd --version` print.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// The build's stamps, set at link time by `make build` from git
// (-ldflags "-X github.com/framepackd/framepackd/internal/buildinfo.Version=v1.2.3 …"); empty
// in a plain `go build`, which falls back on the version control information the Go toolchain
// embeds (none in a git worktree or with -buildvcs=false).
var (
	// Version is the release version (git describe), or a pseudo-version
	// v0.0.0-<commit time>-<commit> between tags.
	Version string
	// Commit is the full commit hash, "+dirty" appended when the tree had changes.
	Commit string
	// CommitTime is the commit's time, RFC 3339.
	CommitTime string
)

// String is one line naming the binary's build: the version, the commit and its time, and the
// Go version. Without stamps or version control information the version reads "devel".
func String(binary string) string {
	bi, _ := debug.ReadBuildInfo()
	return describe(binary, Version, Commit, CommitTime, bi)
}

// describe is String from the link-time stamps and the toolchain's build information (nil:
// none); a stamp wins over what the toolchain recorded.
func describe(binary, version, commit, when string, bi *debug.BuildInfo) string {
	if bi != nil {
		if v := bi.Main.Version; version == "" && v != "" && v != "(devel)" {
			version = v // a pseudo-version from the VCS stamp, or the module version of go install
		}
		var rev, at string
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if commit == "" && rev != "" {
			commit = rev
			if dirty {
				commit += "+dirty"
			}
		}
		if when == "" {
			when = at
		}
	}
	if version == "" {
		version = "devel"
	}
	out := fmt.Sprintf("%s %s", binary, version)
	if commit != "" {
		hash, suffix, _ := strings.Cut(commit, "+")
		if len(hash) > 12 {
			hash = hash[:12]
		}
		if suffix != "" {
			hash += "+" + suffix
		}
		out += " (commit " + hash
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
