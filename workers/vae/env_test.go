package main

import (
	"strings"
	"testing"
)

func TestPlanEnv(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backend string
		env     map[string]string
		apply   []string // variables set
		ignored []string // recorded, not set
		dropped []string
		dirs    int
		err     string
	}{
		{name: "cpu records miopen", backend: "cpu",
			env:     map[string]string{"MIOPEN_FIND_MODE": "5", "MIOPEN_USER_DB_PATH": "/var/cache/fp/miopen", "OMP_NUM_THREADS": "4"},
			apply:   []string{"OMP_NUM_THREADS"},
			ignored: []string{"MIOPEN_FIND_MODE", "MIOPEN_USER_DB_PATH"}},
		{name: "hip applies and makes db dirs", backend: "hip",
			env:   map[string]string{"MIOPEN_FIND_MODE": "DYNAMIC_HYBRID", "MIOPEN_USER_DB_PATH": "/a", "MIOPEN_CUSTOM_CACHE_DIR": "/b", "MIOPEN_DEBUG_FORCE_IMMED_MODE_FALLBACK": "1"},
			apply: []string{"MIOPEN_FIND_MODE", "MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR", "MIOPEN_DEBUG_FORCE_IMMED_MODE_FALLBACK"}, dirs: 2},
		{name: "enforce dropped with fast", backend: "hip",
			env:   map[string]string{"MIOPEN_FIND_MODE": "2", "MIOPEN_FIND_ENFORCE": "3"},
			apply: []string{"MIOPEN_FIND_MODE"}, dropped: []string{"MIOPEN_FIND_ENFORCE"}},
		{name: "enforce kept with normal", backend: "hip",
			env:   map[string]string{"MIOPEN_FIND_MODE": "normal", "MIOPEN_FIND_ENFORCE": "3"},
			apply: []string{"MIOPEN_FIND_MODE", "MIOPEN_FIND_ENFORCE"}},
		{name: "no such variable", backend: "hip",
			env: map[string]string{"MIOPEN_FIND_TIME_LIMIT": "10"}, dropped: []string{"MIOPEN_FIND_TIME_LIMIT"}},
		{name: "bad mode", backend: "cpu", env: map[string]string{"MIOPEN_FIND_MODE": "QUICK"}, err: "MIOPEN_FIND_MODE"},
		{name: "bad fallback", backend: "hip", env: map[string]string{"MIOPEN_DEBUG_FORCE_IMMED_MODE_FALLBACK": "yes"}, err: "want 0 or 1"},
		{name: "relative db", backend: "cpu", env: map[string]string{"MIOPEN_USER_DB_PATH": "db"}, err: "absolute"},
		{name: "bad name", backend: "cpu", env: map[string]string{"A=B": "1"}, err: "not a valid variable"},
		{name: "relative find db", backend: "cuda", env: map[string]string{"FRAMEPACK_CUDNN_FIND_DB": "find"}, err: "absolute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := planEnv(tc.backend, tc.env)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one mentioning %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			check := func(what string, got map[string]string, want []string) {
				if len(got) != len(want) {
					t.Errorf("%s: %v, want %v", what, got, want)
				}
				for _, k := range want {
					if _, ok := got[k]; !ok {
						t.Errorf("%s: %v lacks %s", what, got, k)
					}
				}
			}
			check("applied", p.Apply, tc.apply)
			check("ignored", p.Ignored, tc.ignored)
			check("dropped", p.Dropped, tc.dropped)
			if len(p.Dirs) != tc.dirs {
				t.Errorf("dirs %v, want %d", p.Dirs, tc.dirs)
			}
		})
	}
}

// TestFindDB: on cuda the cuDNN find database defaults to a file beside the conv decision
// cache; a stated one wins; other backends and workers without a cache get none.
func TestFindDB(t *testing.T) {
	for _, tc := range []struct {
		name, backend, cache string
		env                  map[string]string
		want                 string
	}{
		{"cuda beside the cache", "cuda", "/var/cache/fp/conv.json", nil, "/var/cache/fp/conv.json.cudnn-find"},
		{"stated wins", "cuda", "/var/cache/fp/conv.json", map[string]string{"FRAMEPACK_CUDNN_FIND_DB": "/x/db"}, "/x/db"},
		{"no cache", "cuda", "", nil, ""},
		{"hip has miopen's", "hip", "/var/cache/fp/conv.json", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := planEnv(tc.backend, tc.env)
			if err != nil {
				t.Fatal(err)
			}
			if got := p.withFindDB(tc.backend, tc.cache).Apply["FRAMEPACK_CUDNN_FIND_DB"]; got != tc.want {
				t.Errorf("find db %q, want %q", got, tc.want)
			}
		})
	}
}
