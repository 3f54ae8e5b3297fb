package main

import (
	"flag"
	"io"
	"strings"
	"testing"
)

// TestSpecFlagsCache checks what --cache, --teacache and the --magcache-* flags put in the spec,
// and the combinations refused before anything is sent.
func TestSpecFlagsCache(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		cache string
		mag   [3]float64 // threshold, max skips, retention; zero when not sent
		err   string
	}{
		{"default", nil, "teacache", [3]float64{}, ""},
		{"teacache off", []string{"--teacache=false"}, "none", [3]float64{}, ""},
		{"magcache defaults", []string{"--cache", "magcache"}, "magcache", [3]float64{0.1, 2, 0.25}, ""},
		{"magcache settings", []string{"--cache", "magcache", "--magcache-threshold", "0.2", "--magcache-max-skips", "3", "--magcache-retention", "0"},
			"magcache", [3]float64{0.2, 3, 0}, ""},
		{"none", []string{"--cache", "none"}, "none", [3]float64{}, ""},
		{"contradiction", []string{"--cache", "magcache", "--teacache"}, "", [3]float64{}, "contradicts --cache magcache"},
		{"magcache flag without magcache", []string{"--magcache-threshold", "0.2"}, "", [3]float64{}, "need --cache magcache"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var sf specFlags
			sf.register(fs)
			if err := fs.Parse(append([]string{"--prompt", "p"}, tc.args...)); err != nil {
				t.Fatal(err)
			}
			spec, err := sf.spec("generate")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if spec.GetCache() != tc.cache || spec.UseTeacache != nil {
				t.Errorf("cache %q use_teacache %v, want %q and use_teacache unset", spec.GetCache(), spec.UseTeacache, tc.cache)
			}
			got := [3]float64{spec.GetMagcacheThreshold(), float64(spec.GetMagcacheMaxConsecutiveSkips()), spec.GetMagcacheRetentionRatio()}
			if got != tc.mag || (tc.cache == "magcache") != (spec.MagcacheThreshold != nil) {
				t.Errorf("magcache settings %v, want %v", got, tc.mag)
			}
		})
	}
}
