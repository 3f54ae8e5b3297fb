package main

import (
	"strings"
	"testing"
)

// TestFindDB: on cuda the cuDNN find database defaults to a file beside the conv decision
// cache; a stated one wins and must be absolute; other backends and workers without a cache
// get none.
func TestFindDB(t *testing.T) {
	for _, tc := range []struct {
		name, backend, cache string
		env                  map[string]string
		want, err            string
	}{
		{name: "cuda beside the cache", backend: "cuda", cache: "/var/cache/fp/conv.json", want: "/var/cache/fp/conv.json.cudnn-find"},
		{name: "stated wins", backend: "cuda", cache: "/var/cache/fp/conv.json", env: map[string]string{"FRAMEPACK_CUDNN_FIND_DB": "/x/db"}, want: "/x/db"},
		{name: "stated without a cache", backend: "cuda", env: map[string]string{"FRAMEPACK_CUDNN_FIND_DB": "/x/db"}, want: "/x/db"},
		{name: "relative", backend: "cuda", env: map[string]string{"FRAMEPACK_CUDNN_FIND_DB": "find"}, err: "absolute"},
		{name: "no cache", backend: "cuda"},
		{name: "hip has miopen's", backend: "hip", cache: "/var/cache/fp/conv.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := findDB(tc.backend, tc.cache, tc.env)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one mentioning %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("find db %q, want %q", got, tc.want)
			}
		})
	}
}
