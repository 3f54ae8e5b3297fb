package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// TestDescribe: link-time stamps win; without them the toolchain's version control stamp
// gives the version and the commit; without either the version is "devel".
func TestDescribe(t *testing.T) {
	vcs := &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261125120000-0123456789ab+dirty"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"}, {Key: "vcs.time", Value: "2026-11-25T12:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}
	for _, tc := range []struct {
		name                  string
		version, commit, when string
		bi                    *debug.BuildInfo
		want                  string
	}{
		{name: "stamped", version: "v1.2.3", commit: "fedcba9876543210fedcba9876543210fedcba98", when: "2026-12-01T00:00:00Z", bi: vcs,
			want: "framepack v1.2.3 (commit fedcba987654, 2026-12-01T00:00:00Z)"},
		{name: "stamped dirty", version: "v0.0.0-20261201000000-fedcba987654+dirty", commit: "fedcba9876543210fedcba9876543210fedcba98+dirty",
			want: "framepack v0.0.0-20261201000000-fedcba987654+dirty (commit fedcba987654+dirty)"},
		{name: "toolchain's vcs stamp", bi: vcs,
			want: "framepack v0.0.0-20261125120000-0123456789ab+dirty (commit 0123456789ab+dirty, 2026-11-25T12:00:00Z)"},
		{name: "go install", bi: &debug.BuildInfo{Main: debug.Module{Version: "v1.0.0"}}, want: "framepack v1.0.0"},
		{name: "nothing", bi: &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, want: "framepack devel"},
		{name: "no build info", want: "framepack devel"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := describe("framepack", tc.version, tc.commit, tc.when, tc.bi); got != tc.want+" "+runtime.Version() {
				t.Errorf("got  %q\nwant %q", got, tc.want+" "+runtime.Version())
			}
		})
	}
	if s := String("x"); !strings.HasPrefix(s, "x ") {
		t.Errorf("String: %q", s)
	}
}
