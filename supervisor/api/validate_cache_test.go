package api

import (
	"math"
	"testing"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
	"google.golang.org/protobuf/proto"
)

// TestValidateCache checks JobSpec.cache and the MagCache settings at submit, and the defaults
// the stored spec gets: one violation on the field, saying what is wrong.
func TestValidateCache(t *testing.T) {
	ok := func([]byte) (int, int, error) { return 1, 1, nil }
	tests := []struct {
		name    string
		edit    func(s *framepackv1.JobSpec)
		field   string
		message string
		cache   string // the stored spec's cache
	}{
		{"default", func(*framepackv1.JobSpec) {}, "", "", plan.CacheTeaCache},
		{"use_teacache false", func(s *framepackv1.JobSpec) { s.UseTeacache = proto.Bool(false) }, "", "", plan.CacheNone},
		{"magcache", func(s *framepackv1.JobSpec) { s.Cache = "magcache" }, "", "", plan.CacheMagCache},
		{"magcache settings", func(s *framepackv1.JobSpec) {
			s.Cache, s.MagcacheThreshold, s.MagcacheMaxConsecutiveSkips, s.MagcacheRetentionRatio = "magcache", proto.Float64(0.2), proto.Uint32(5), proto.Float64(0)
		}, "", "", plan.CacheMagCache},
		{"none with use_teacache false", func(s *framepackv1.JobSpec) { s.Cache, s.UseTeacache = "none", proto.Bool(false) }, "", "", plan.CacheNone},
		{"unknown", func(s *framepackv1.JobSpec) { s.Cache = "fastcache" }, "spec.cache", `unknown cache "fastcache"`, ""},
		{"contradiction", func(s *framepackv1.JobSpec) { s.Cache, s.UseTeacache = "magcache", proto.Bool(true) }, "spec.use_teacache",
			`contradicts spec.cache "magcache"`, ""},
		{"settings without magcache", func(s *framepackv1.JobSpec) { s.MagcacheThreshold = proto.Float64(0.2) }, "spec.magcache_threshold",
			`without spec.cache "magcache"`, ""},
		{"threshold", func(s *framepackv1.JobSpec) { s.Cache, s.MagcacheThreshold = "magcache", proto.Float64(0) }, "spec.magcache_threshold",
			"0.01 to 1", ""},
		{"threshold nan", func(s *framepackv1.JobSpec) { s.Cache, s.MagcacheThreshold = "magcache", proto.Float64(math.NaN()) },
			"spec.magcache_threshold", "0.01 to 1", ""},
		{"skips", func(s *framepackv1.JobSpec) { s.Cache, s.MagcacheMaxConsecutiveSkips = "magcache", proto.Uint32(6) },
			"spec.magcache_max_consecutive_skips", "1 to 5", ""},
		{"retention", func(s *framepackv1.JobSpec) { s.Cache, s.MagcacheRetentionRatio = "magcache", proto.Float64(1.5) },
			"spec.magcache_retention_ratio", "0 to 1", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := &framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 1}
			tc.edit(spec)
			v := validateSubmit(&framepackv1.SubmitJobRequest{Image: []byte{1}, Spec: spec}, nil, ok)
			wantViolation(t, v, tc.field, tc.message)
			if tc.cache == "" {
				return
			}
			d := WithDefaults(spec)
			if d.GetCache() != tc.cache || d.GetUseTeacache() != (tc.cache == plan.CacheTeaCache) {
				t.Errorf("stored cache %q use_teacache %v, want %q", d.GetCache(), d.GetUseTeacache(), tc.cache)
			}
			if tc.cache == plan.CacheMagCache && (d.MagcacheThreshold == nil || d.MagcacheMaxConsecutiveSkips == nil || d.MagcacheRetentionRatio == nil) {
				t.Errorf("stored MagCache settings not filled in: %v", d)
			}
			if tc.cache != plan.CacheMagCache && d.MagcacheThreshold != nil {
				t.Errorf("MagCache settings stored for cache %q", tc.cache)
			}
		})
	}
}
