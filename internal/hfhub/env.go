// Package hfhub downloads model repositories from the Hugging Face hub into the hub's standard
// cache layout, the one huggingface_hub (and so FramePack's own hf_download/ folder) writes and
// reads:
//
//	<cache>/models--<org>--<name>/blobs/<etag>                    file contents, named by ETag
//	<cache>/models--<org>--<name>/blobs/<etag>.incomplete         a download in progress (resumed)
//	<cache>/models--<org>--<name>/snapshots/<commit>/<path>       relative symlinks into blobs/
//	<cache>/models--<org>--<name>/refs/<revision>                 the commit a revision named
//	<cache>/.locks/models--<org>--<name>/<etag>.lock              one writer per blob
//
// It speaks the hub's public HTTP API as huggingface_hub does: the revision is turned into a
// commit by GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true (which also lists the
// files, with the sha256 and size of every LFS file), and every file is then fetched by that
// commit, so a pull never mixes two commits: HEAD {endpoint}/{repo}/resolve/{commit}/{path}
// without following absolute redirects gives X-Repo-Commit, the ETag (X-Linked-Etag for LFS
// files, which is their sha256) and the size (X-Linked-Size); the GET then goes to the redirect's
// Location (LFS files live on a second host, which never sees the token) with a Range header when
// a partial blob is resumed. Every blob is verified before it is renamed into blobs/ and linked
// into the snapshot: sha256 for LFS files, the git blob sha1 for the others.
//
// The environment is read as huggingface_hub reads it (FromEnv): HF_ENDPOINT, HF_TOKEN (else
// $HF_HOME/token), HF_HUB_OFFLINE, HF_HUB_CACHE / HF_HOME.
package hfhub

import (
	"os"
	"path/filepath"
	"strings"
)

// DefaultEndpoint is the hub's address when HF_ENDPOINT is not set.
const DefaultEndpoint = "https://huggingface.co"

// Env is the part of the environment huggingface_hub reads that a pull needs.
type Env struct {
	// Endpoint is the hub (HF_ENDPOINT, for mirrors), without a trailing slash.
	Endpoint string
	// Token authenticates to the endpoint (HF_TOKEN, HUGGING_FACE_HUB_TOKEN, else the file
	// $HF_HOME/token that `huggingface-cli login` writes); empty for anonymous access.
	Token string
	// Offline forbids network access (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE true).
	Offline bool
	// Cache is the hub cache folder (HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
	// $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub).
	Cache string
}

// FromEnv reads Env from the process environment.
func FromEnv() Env { return envFrom(os.Getenv) }

func envFrom(get func(string) string) Env {
	e := Env{Endpoint: strings.TrimRight(get("HF_ENDPOINT"), "/")}
	if e.Endpoint == "" {
		e.Endpoint = DefaultEndpoint
	}
	home := get("HF_HOME")
	if home == "" {
		xdg := get("XDG_CACHE_HOME")
		if xdg == "" {
			if h, err := os.UserHomeDir(); err == nil {
				xdg = filepath.Join(h, ".cache")
			} else {
				xdg = ".cache"
			}
		}
		home = filepath.Join(xdg, "huggingface")
	}
	e.Cache = get("HF_HUB_CACHE")
	if e.Cache == "" {
		e.Cache = get("HUGGINGFACE_HUB_CACHE")
	}
	if e.Cache == "" {
		e.Cache = filepath.Join(home, "hub")
	}
	e.Token = strings.TrimSpace(get("HF_TOKEN"))
	if e.Token == "" {
		e.Token = strings.TrimSpace(get("HUGGING_FACE_HUB_TOKEN"))
	}
	if e.Token == "" {
		if b, err := os.ReadFile(filepath.Join(home, "token")); err == nil {
			e.Token = strings.TrimSpace(string(b))
		}
	}
	e.Offline = isTrue(get("HF_HUB_OFFLINE")) || isTrue(get("TRANSFORMERS_OFFLINE"))
	return e
}

// isTrue reads a boolean variable as huggingface_hub does.
func isTrue(v string) bool {
	switch strings.ToUpper(strings.TrimSpace(v)) {
	case "1", "ON", "YES", "TRUE":
		return true
	}
	return false
}

// CacheRoot is the hub cache inside dir: dir/hub when that folder exists (dir is then a
// HF_HOME, as FramePack's hf_download/ is), else dir itself.
func CacheRoot(dir string) string {
	if st, err := os.Stat(filepath.Join(dir, "hub")); err == nil && st.IsDir() {
		return filepath.Join(dir, "hub")
	}
	return dir
}
