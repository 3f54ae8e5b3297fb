package hfhub_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/hfhub"
	"github.com/framepackd/framepackd/internal/hfhub/hubtest"
	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/supervisor/pipeline"
)

// fixture is a fake hub serving the tiny models and an empty cache.
type fixture struct {
	hub     *hubtest.Hub
	commits map[string]string
	models  string // testdata/parity/models
	cache   hfhub.Cache
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	root, err := parity.Root()
	if err != nil {
		t.Fatal(err)
	}
	h := hubtest.New()
	t.Cleanup(h.Close)
	f := &fixture{hub: h, models: filepath.Join(root, "models"), cache: hfhub.Cache{Root: filepath.Join(t.TempDir(), "hub")}}
	if f.commits, err = h.PushFixtures(f.models); err != nil {
		t.Fatal(err)
	}
	return f
}

// puller returns a Puller on the fixture; its progress reports are collected in *reports.
func (f *fixture) puller(token string, reports *[]hfhub.Progress) *hfhub.Puller {
	var mu sync.Mutex
	return &hfhub.Puller{
		Client:  &hfhub.Client{Endpoint: f.hub.Endpoint(), Token: token},
		Cache:   f.cache,
		Backoff: func(int) time.Duration { return time.Millisecond },
		Progress: func(p hfhub.Progress) {
			if reports != nil {
				mu.Lock()
				*reports = append(*reports, p)
				mu.Unlock()
			}
		},
	}
}

func (f *fixture) pull(t *testing.T, p *hfhub.Puller, variants ...string) error {
	t.Helper()
	wants, err := hfhub.Wants(variants, "")
	if err != nil {
		t.Fatal(err)
	}
	plan, err := p.Plan(t.Context(), wants)
	if err != nil {
		return err
	}
	return p.Pull(t.Context(), plan)
}

// fixtureFile is the fixture's copy of a repository file.
func (f *fixture) fixtureFile(t *testing.T, repo, path string) []byte {
	t.Helper()
	for dir, id := range hubtest.FixtureRepos {
		if id == repo {
			b, err := os.ReadFile(filepath.Join(f.models, dir, filepath.FromSlash(path)))
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
	t.Fatalf("no fixture for %s", repo)
	return nil
}

func TestPullLayout(t *testing.T) {
	f := newFixture(t)
	f.hub.AddToken("hf_good", true)
	var reports []hfhub.Progress
	if err := f.pull(t, f.puller("hf_good", &reports), "i2v", "f1"); err != nil {
		t.Fatal(err)
	}
	for dir, repo := range hubtest.FixtureRepos {
		commit := f.commits[repo]
		entry := f.cache.RepoDir(repo)
		if got, err := os.ReadFile(filepath.Join(entry, "refs", "main")); err != nil || string(got) != commit {
			t.Fatalf("%s refs/main = %q %v, want %s", repo, got, err, commit)
		}
		// Every fixture file is linked, relative, into blobs named by its ETag, same bytes.
		n := 0
		err := filepath.WalkDir(filepath.Join(f.models, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(filepath.Join(f.models, dir), p)
			link := f.cache.SnapshotPath(repo, commit, filepath.ToSlash(rel))
			target, err := os.Readlink(link)
			if err != nil {
				t.Errorf("%s %s: not a link: %v", repo, rel, err)
				return nil
			}
			if filepath.IsAbs(target) || !strings.HasPrefix(target, "../") || filepath.Dir(filepath.Clean(filepath.Join(filepath.Dir(link), target))) != filepath.Join(entry, "blobs") {
				t.Errorf("%s %s links to %s, want a relative path into blobs/", repo, rel, target)
			}
			etag := filepath.Base(target)
			st, _ := os.Stat(link)
			if lfs := strings.HasSuffix(rel, ".safetensors") || st.Size() >= hubtest.LFSThreshold; lfs != (len(etag) == 64) {
				t.Errorf("%s %s: blob %s: want sha256 names for LFS files, git sha1 for others", repo, rel, etag)
			}
			got, err := os.ReadFile(link)
			if err != nil || !bytes.Equal(got, f.fixtureFile(t, repo, filepath.ToSlash(rel))) {
				t.Errorf("%s %s: contents differ (%v)", repo, rel, err)
			}
			n++
			return nil
		})
		if err != nil || n == 0 {
			t.Fatalf("%s: %d files, %v", repo, n, err)
		}
		// No partial blobs left behind.
		if m, _ := filepath.Glob(filepath.Join(entry, "blobs", "*.incomplete")); len(m) > 0 {
			t.Errorf("partial blobs left: %v", m)
		}
	}
	// Only the needed files: no decoy was asked for. The LFS host never saw the token, the
	// hub always did; files were fetched by commit, not by branch.
	for _, r := range f.hub.Requests() {
		for repo, decoys := range hubtest.Decoys {
			for _, d := range decoys {
				if strings.HasSuffix(r.Path, repo+"/resolve/"+f.commits[repo]+"/"+d) {
					t.Errorf("decoy requested: %s %s", r.Method, r.Path)
				}
			}
		}
		switch r.Server {
		case "lfs":
			if r.Authorization != "" {
				t.Errorf("token sent to the LFS host: %+v", r)
			}
		case "api":
			if r.Authorization != "Bearer hf_good" {
				t.Errorf("no token sent to the hub: %+v", r)
			}
			if strings.Contains(r.Path, "/resolve/main/") {
				t.Errorf("file fetched by branch, not commit: %s", r.Path)
			}
		}
	}
	last := reports[len(reports)-1]
	if last.TotalDone != last.Total || last.FilesDone != last.Files || last.Total == 0 {
		t.Fatalf("last progress %+v", last)
	}

	// The daemon's resolver finds the pulled cache through refs/main.
	m, err := pipeline.ResolveModels(f.cache.Root)
	if err != nil {
		t.Fatal(err)
	}
	if want := f.cache.SnapshotDir("lllyasviel/FramePackI2V_HY", f.commits["lllyasviel/FramePackI2V_HY"]); m.Transformer != want {
		t.Fatalf("transformer resolved to %s, want %s", m.Transformer, want)
	}
	if v := hfhub.VariantComplete(f.cache.Status("")); !v["i2v"] || !v["f1"] {
		t.Fatalf("variants complete %v", v)
	}

	// A second pull finds everything and downloads nothing.
	before := len(f.hub.Requests())
	if err := f.pull(t, f.puller("hf_good", nil), "i2v", "f1"); err != nil {
		t.Fatal(err)
	}
	for _, r := range f.hub.Requests()[before:] {
		if r.Server == "lfs" || strings.Contains(r.Path, "/resolve/") {
			t.Errorf("second pull fetched %s %s", r.Method, r.Path)
		}
	}
}

func TestPullPinnedCommit(t *testing.T) {
	f := newFixture(t)
	repo := "lllyasviel/FramePackI2V_HY"
	old := f.commits[repo]
	cfg := f.fixtureFile(t, repo, "config.json")
	weights := f.fixtureFile(t, repo, "diffusion_pytorch_model.safetensors")
	newer := f.hub.Push(repo, map[string][]byte{"config.json": append(bytes.Clone(cfg), ' '), "diffusion_pytorch_model.safetensors": weights})

	// Pinned to the old commit: its snapshot, no ref written.
	p := f.puller("", nil)
	plan, err := p.Plan(t.Context(), []hfhub.Want{{Repo: repo, Revision: old, Include: hfhub.FramePackI2V.Want("").Include}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Pull(t.Context(), plan); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(f.cache.SnapshotPath(repo, old, "config.json")); !bytes.Equal(got, cfg) {
		t.Fatalf("pinned config %q", got)
	}
	if _, err := os.Stat(filepath.Join(f.cache.RepoDir(repo), "refs", "main")); !os.IsNotExist(err) {
		t.Fatalf("refs/main written for a commit pull: %v", err)
	}

	// main now: the new commit; the unchanged weights blob is shared, not downloaded again.
	lfsBefore := countServer(f.hub.Requests(), "lfs")
	plan, err = p.Plan(t.Context(), []hfhub.Want{hfhub.FramePackI2V.Want("main")})
	if err != nil {
		t.Fatal(err)
	}
	if plan.Repos[0].Commit != newer {
		t.Fatalf("main resolved to %s, want %s", plan.Repos[0].Commit, newer)
	}
	// main moves again while we pull: files still come from the commit the plan pinned.
	f.hub.Push(repo, map[string][]byte{"config.json": []byte("{}"), "diffusion_pytorch_model.safetensors": weights})
	if err := p.Pull(t.Context(), plan); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(f.cache.SnapshotPath(repo, newer, "config.json")); !bytes.Equal(got, append(bytes.Clone(cfg), ' ')) {
		t.Fatalf("config at %s: %q", newer, got)
	}
	if ref, _ := f.cache.Ref(repo, "main"); ref != newer {
		t.Fatalf("refs/main %s, want %s", ref, newer)
	}
	if n := countServer(f.hub.Requests(), "lfs") - lfsBefore; n != 0 {
		t.Fatalf("%d LFS downloads for an unchanged blob", n)
	}
}

func countServer(rs []hubtest.Request, server string) int {
	n := 0
	for _, r := range rs {
		if r.Server == server {
			n++
		}
	}
	return n
}

const vaeWeights = "vae/diffusion_pytorch_model.safetensors"
const hunyuan = "hunyuanvideo-community/HunyuanVideo"

// rangesFor lists the Range headers of the LFS GETs of a file's blob.
func rangesFor(rs []hubtest.Request, sha string) []string {
	var out []string
	for _, r := range rs {
		if r.Server == "lfs" && r.Method == "GET" && strings.HasSuffix(r.Path, sha) {
			out = append(out, r.Range)
		}
	}
	return out
}

func TestPullResumesDroppedConnection(t *testing.T) {
	f := newFixture(t)
	const dropAt = 3 << 20
	f.hub.SetFault(hunyuan, vaeWeights, &hubtest.Fault{DropAt: dropAt, Times: 1})
	if err := f.pull(t, f.puller("", nil), "i2v"); err != nil {
		t.Fatal(err)
	}
	sha := sha256Of(f.fixtureFile(t, hunyuan, vaeWeights))
	if got := rangesFor(f.hub.Requests(), sha); len(got) != 2 || got[0] != "" || got[1] != "bytes=3145728-" {
		t.Fatalf("LFS requests' ranges %q, want a full GET then a resume from the drop", got)
	}
	got, err := os.ReadFile(f.cache.SnapshotPath(hunyuan, f.commits[hunyuan], vaeWeights))
	if err != nil || !bytes.Equal(got, f.fixtureFile(t, hunyuan, vaeWeights)) {
		t.Fatalf("resumed file differs (%v)", err)
	}
}

func TestPullKilledResumesNextRun(t *testing.T) {
	f := newFixture(t)
	const dropAt = 2 << 20
	f.hub.SetFault(hunyuan, vaeWeights, &hubtest.Fault{DropAt: dropAt, Times: 1})
	p := f.puller("", nil)
	p.Retries = -1 // the first run ends at the drop, as a killed pull would
	err := f.pull(t, p, "i2v")
	if !errors.Is(err, hfhub.ErrTruncated) || !strings.Contains(err.Error(), vaeWeights) {
		t.Fatalf("first pull: %v, want ErrTruncated naming the file", err)
	}
	want := f.fixtureFile(t, hunyuan, vaeWeights)
	sha := sha256Of(want)
	commit := f.commits[hunyuan]
	if st, err := os.Stat(f.cache.BlobPath(hunyuan, sha) + ".incomplete"); err != nil || st.Size() != dropAt {
		t.Fatalf("partial blob %v %v, want %d bytes", st, err, dropAt)
	}
	if _, err := os.Lstat(f.cache.SnapshotPath(hunyuan, commit, vaeWeights)); !os.IsNotExist(err) {
		t.Fatalf("partial file linked: %v", err)
	}
	if _, err := os.Stat(filepath.Join(f.cache.RepoDir(hunyuan), "refs", "main")); !os.IsNotExist(err) {
		t.Fatalf("refs/main written for an incomplete repository: %v", err)
	}
	if v := hfhub.VariantComplete(f.cache.Status("")); v["i2v"] {
		t.Fatal("i2v reported complete")
	}

	// The next run plans the remainder only and resumes with a Range request.
	wants, _ := hfhub.Wants([]string{"i2v"}, "")
	p2 := f.puller("", nil)
	plan, err := p2.Plan(t.Context(), wants)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Need != int64(len(want))-dropAt {
		t.Fatalf("plan needs %d bytes, want %d", plan.Need, int64(len(want))-dropAt)
	}
	if err := p2.Pull(t.Context(), plan); err != nil {
		t.Fatal(err)
	}
	if got := rangesFor(f.hub.Requests(), sha); len(got) != 2 || got[1] != "bytes=2097152-" {
		t.Fatalf("ranges %q", got)
	}
	got, err := os.ReadFile(f.cache.SnapshotPath(hunyuan, commit, vaeWeights))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("resumed file differs (%v)", err)
	}
}

func TestPullChecksumMismatch(t *testing.T) {
	f := newFixture(t)
	f.hub.SetFault(hunyuan, vaeWeights, &hubtest.Fault{Corrupt: true, Times: 1})
	err := f.pull(t, f.puller("", nil), "i2v")
	if !errors.Is(err, hfhub.ErrChecksum) || !strings.Contains(err.Error(), vaeWeights) || !strings.Contains(err.Error(), hunyuan) {
		t.Fatalf("err %v, want ErrChecksum naming the file", err)
	}
	sha := sha256Of(f.fixtureFile(t, hunyuan, vaeWeights))
	commit := f.commits[hunyuan]
	for _, p := range []string{f.cache.BlobPath(hunyuan, sha), f.cache.SnapshotPath(hunyuan, commit, vaeWeights)} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after a checksum mismatch: %v", p, err)
		}
	}
	// The other repositories are complete and referenced; this one is not.
	if _, ok := f.cache.Ref("lllyasviel/flux_redux_bfl", "main"); !ok {
		t.Error("flux_redux_bfl has no ref after its files succeeded")
	}
	if _, ok := f.cache.Ref(hunyuan, "main"); ok {
		t.Error("HunyuanVideo referenced with a corrupt file")
	}
	// The next pull downloads it again and succeeds.
	if err := f.pull(t, f.puller("", nil), "i2v"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(f.cache.SnapshotPath(hunyuan, commit, vaeWeights)); !bytes.Equal(got, f.fixtureFile(t, hunyuan, vaeWeights)) {
		t.Fatal("file differs after the second pull")
	}
}

func TestPullRefusals(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(f *fixture)
		token   string
		variant string
		is      error
		want    []string
	}{
		{name: "gated anonymous 401", setup: func(f *fixture) { f.hub.SetGated("lllyasviel/flux_redux_bfl", true) },
			variant: "i2v", is: hfhub.ErrUnauthorized, want: []string{"lllyasviel/flux_redux_bfl", "HTTP 401", "HF_TOKEN", "gated"}},
		{name: "gated without access 403", setup: func(f *fixture) {
			f.hub.SetGated("lllyasviel/flux_redux_bfl", true)
			f.hub.AddToken("hf_noaccess", false)
		}, token: "hf_noaccess", variant: "i2v", is: hfhub.ErrUnauthorized, want: []string{"HTTP 403", "accept the repository's terms", "https://huggingface.co/lllyasviel/flux_redux_bfl"}},
		{name: "bad token 401", token: "hf_wrong", variant: "i2v", is: hfhub.ErrUnauthorized, want: []string{"HTTP 401", "refused the token"}},
		{name: "file 404", setup: func(f *fixture) {
			f.hub.SetFault(hunyuan, "vae/config.json", &hubtest.Fault{Status: 404})
		}, variant: "i2v", is: hfhub.ErrNotFound, want: []string{"vae/config.json", hunyuan, "HTTP 404"}},
		{name: "missing repository", setup: func(f *fixture) {
			f.hub.AddToken("hf_good", true)
			f.hub.Remove("lllyasviel/FramePack_F1_I2V_HY_20250503")
		}, token: "hf_good", variant: "f1", is: hfhub.ErrNotFound, want: []string{"FramePack_F1_I2V_HY_20250503", "RepoNotFound"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root, err := parity.Root()
			if err != nil {
				t.Fatal(err)
			}
			h := hubtest.New()
			t.Cleanup(h.Close)
			f := &fixture{hub: h, models: filepath.Join(root, "models"), cache: hfhub.Cache{Root: t.TempDir()}}
			if f.commits, err = h.PushFixtures(f.models); err != nil {
				t.Fatal(err)
			}
			if tc.setup != nil {
				tc.setup(f)
			}
			err = f.pull(t, f.puller(tc.token, nil), tc.variant)
			if !errors.Is(err, tc.is) {
				t.Fatalf("err %v, want %v", err, tc.is)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			// Refusals come while planning: nothing is downloaded or linked.
			if n := countServer(h.Requests(), "lfs"); n != 0 {
				t.Errorf("%d downloads after a refusal", n)
			}
			if m, _ := filepath.Glob(filepath.Join(f.cache.Root, "*", "snapshots", "*")); len(m) > 0 {
				t.Errorf("snapshots written: %v", m)
			}
		})
	}
}

func TestPullNoSpace(t *testing.T) {
	f := newFixture(t)
	p := f.puller("", nil)
	var asked string
	p.FreeSpace = func(dir string) (uint64, error) { asked = dir; return 1 << 20, nil }
	err := f.pull(t, p, "i2v")
	if !errors.Is(err, hfhub.ErrNoSpace) || !strings.Contains(err.Error(), "1.0 MiB free") {
		t.Fatalf("err %v, want ErrNoSpace saying what is free", err)
	}
	if asked != f.cache.Root {
		t.Fatalf("free space asked of %q", asked)
	}
	if n := countServer(f.hub.Requests(), "lfs"); n != 0 {
		t.Fatalf("%d downloads before the space check failed", n)
	}
	if blobs, _ := filepath.Glob(filepath.Join(f.cache.Root, "*", "blobs", "*")); len(blobs) > 0 {
		t.Fatalf("files written: %v", blobs)
	}
}

func TestPullOffline(t *testing.T) {
	f := newFixture(t)
	wants, _ := hfhub.Wants([]string{"i2v"}, "")
	off := &hfhub.Puller{Cache: f.cache, Offline: true}
	if _, err := off.Plan(t.Context(), wants); !errors.Is(err, hfhub.ErrOffline) {
		t.Fatalf("offline plan on an empty cache: %v", err)
	}
	if err := f.pull(t, f.puller("", nil), "i2v"); err != nil {
		t.Fatal(err)
	}
	before := len(f.hub.Requests())
	plan, err := off.Plan(t.Context(), wants)
	if err != nil {
		t.Fatal(err)
	}
	if err := off.Pull(t.Context(), plan); err != nil || plan.Need != 0 || len(plan.Items) == 0 {
		t.Fatalf("offline pull of a complete cache: %v (need %d, %d files)", err, plan.Need, len(plan.Items))
	}
	if len(f.hub.Requests()) != before {
		t.Fatal("offline mode reached the network")
	}
}

func TestVerify(t *testing.T) {
	f := newFixture(t)
	if err := f.pull(t, f.puller("", nil), "i2v"); err != nil {
		t.Fatal(err)
	}
	commit := f.commits[hunyuan]
	res, err := f.cache.Verify(t.Context(), hunyuan, commit, nil)
	if err != nil || len(res.Bad) != 0 || res.Files == 0 {
		t.Fatalf("clean cache: %+v %v", res, err)
	}
	// Flip one byte of a blob (an LFS one and a git one).
	for _, p := range []string{vaeWeights, "vae/config.json"} {
		blob, err := filepath.EvalSymlinks(f.cache.SnapshotPath(hunyuan, commit, p))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(blob)
		b[len(b)/2] ^= 1
		if err := os.WriteFile(blob, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res, err = f.cache.Verify(t.Context(), hunyuan, commit, nil)
	if err != nil || len(res.Bad) != 2 {
		t.Fatalf("corrupt cache: %+v %v", res, err)
	}
	if err := f.cache.RemoveBad(commit, res.Bad); err != nil {
		t.Fatal(err)
	}
	if v := hfhub.VariantComplete(f.cache.Status("")); v["i2v"] {
		t.Fatal("i2v complete after its bad files were removed")
	}
	// A pull mends it.
	if err := f.pull(t, f.puller("", nil), "i2v"); err != nil {
		t.Fatal(err)
	}
	if res, err = f.cache.Verify(t.Context(), hunyuan, commit, nil); err != nil || len(res.Bad) != 0 {
		t.Fatalf("after the pull: %+v %v", res, err)
	}
}

func TestEnv(t *testing.T) {
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, "token"), []byte("hf_file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"HF_ENDPOINT": "http://mirror.example/", "HF_HOME": home, "HF_TOKEN": "",
		"HUGGING_FACE_HUB_TOKEN": "", "HF_HUB_OFFLINE": "yes", "HF_HUB_CACHE": "", "HUGGINGFACE_HUB_CACHE": "", "TRANSFORMERS_OFFLINE": ""} {
		t.Setenv(k, v)
	}
	e := hfhub.FromEnv()
	if e.Endpoint != "http://mirror.example" || e.Token != "hf_file" || !e.Offline || e.Cache != filepath.Join(home, "hub") {
		t.Fatalf("env %+v", e)
	}
	t.Setenv("HF_TOKEN", "hf_env")
	t.Setenv("HF_HUB_CACHE", "/somewhere")
	t.Setenv("HF_HUB_OFFLINE", "0")
	if e := hfhub.FromEnv(); e.Token != "hf_env" || e.Cache != "/somewhere" || e.Offline {
		t.Fatalf("env %+v", e)
	}
	// FramePack's hf_download/ is a HF_HOME: its hub/ is the cache.
	if got := hfhub.CacheRoot(home); got != home {
		t.Fatalf("CacheRoot without hub/: %s", got)
	}
	if err := os.Mkdir(filepath.Join(home, "hub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := hfhub.CacheRoot(home); got != filepath.Join(home, "hub") {
		t.Fatalf("CacheRoot with hub/: %s", got)
	}
}

func sha256Of(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestPullDiskFull: a write that fails with ENOSPC (the partial blob is /dev/full) fails the
// file with ErrNoSpace at once, without retries, and links nothing.
func TestPullDiskFull(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skipf("no /dev/full: %v", err)
	}
	f := newFixture(t)
	sha := sha256Of(f.fixtureFile(t, hunyuan, vaeWeights))
	partial := f.cache.BlobPath(hunyuan, sha) + ".incomplete"
	if err := os.MkdirAll(filepath.Dir(partial), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/full", partial); err != nil {
		t.Fatal(err)
	}
	err := f.pull(t, f.puller("", nil), "i2v")
	if !errors.Is(err, hfhub.ErrNoSpace) || !strings.Contains(err.Error(), vaeWeights) {
		t.Fatalf("err %v, want ErrNoSpace naming the file", err)
	}
	if got := rangesFor(f.hub.Requests(), sha); len(got) != 1 {
		t.Fatalf("%d downloads of the file, want 1 (a full disk is not retried)", len(got))
	}
	if _, err := os.Lstat(f.cache.SnapshotPath(hunyuan, f.commits[hunyuan], vaeWeights)); !os.IsNotExist(err) {
		t.Fatalf("file linked after a full disk: %v", err)
	}
	if _, err := os.Stat(f.cache.BlobPath(hunyuan, sha)); !os.IsNotExist(err) {
		t.Fatalf("blob written after a full disk: %v", err)
	}
}

// TestPullStalledTransfer: a transfer that stops sending is abandoned after StallTimeout and
// resumed in the same pull.
func TestPullStalledTransfer(t *testing.T) {
	f := newFixture(t)
	const stallAt = 1 << 20
	f.hub.SetFault(hunyuan, vaeWeights, &hubtest.Fault{StallAt: stallAt, Times: 1})
	p := f.puller("", nil)
	p.StallTimeout = 300 * time.Millisecond
	if err := f.pull(t, p, "i2v"); err != nil {
		t.Fatal(err)
	}
	want := f.fixtureFile(t, hunyuan, vaeWeights)
	if got := rangesFor(f.hub.Requests(), sha256Of(want)); len(got) != 2 || got[1] != "bytes=1048576-" {
		t.Fatalf("ranges %q, want a resume at the stall", got)
	}
	if got, err := os.ReadFile(f.cache.SnapshotPath(hunyuan, f.commits[hunyuan], vaeWeights)); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("file differs after the stall (%v)", err)
	}
}

// TestPullRetriesServerErrors: a 503 is retried; a 404 is not.
func TestPullRetriesServerErrors(t *testing.T) {
	f := newFixture(t)
	f.hub.SetFault(hunyuan, "vae/config.json", &hubtest.Fault{Status: 503, Times: 2})
	if err := f.pull(t, f.puller("", nil), "i2v"); err != nil {
		t.Fatalf("pull after two 503s: %v", err)
	}
	heads := 0
	for _, r := range f.hub.Requests() {
		if r.Method == "HEAD" && strings.HasSuffix(r.Path, "/vae/config.json") {
			heads++
		}
	}
	if heads != 3 {
		t.Fatalf("%d HEADs of vae/config.json, want 3 (two refused, one answered)", heads)
	}
}

// TestPullRenamedRepository: a renamed repository's relative redirects are followed; the cache
// entry keeps the name asked for, as huggingface_hub keeps it.
func TestPullRenamedRepository(t *testing.T) {
	f := newFixture(t)
	f.hub.Rename("lllyasviel/FramePackI2V_HY", "lllyasviel/FramePackI2V_HY_v2")
	if err := f.pull(t, f.puller("", nil), "i2v"); err != nil {
		t.Fatal(err)
	}
	repo := "lllyasviel/FramePackI2V_HY"
	if got, err := os.ReadFile(f.cache.SnapshotPath(repo, f.commits[repo], "config.json")); err != nil || !bytes.Equal(got, f.fixtureFile(t, repo, "config.json")) {
		t.Fatalf("config of the renamed repository: %v", err)
	}
	moved := false
	for _, r := range f.hub.Requests() {
		moved = moved || strings.Contains(r.Path, "FramePackI2V_HY_v2/resolve/")
	}
	if !moved {
		t.Fatal("the redirect to the new name was not followed")
	}
}

// TestCheckSharded: a folder with an index needs every shard it names; links to missing blobs
// do not count.
func TestCheckSharded(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("config.json", "{}")
	write("diffusion_pytorch_model.safetensors.index.json", `{"weight_map": {"a": "diffusion_pytorch_model-00001-of-00002.safetensors", "b": "diffusion_pytorch_model-00002-of-00002.safetensors"}}`)
	write("diffusion_pytorch_model-00001-of-00002.safetensors", "x")
	if err := os.Symlink("../../blobs/gone", filepath.Join(dir, "diffusion_pytorch_model-00002-of-00002.safetensors")); err != nil {
		t.Fatal(err)
	}
	got := hfhub.FramePackI2V.Check(dir)
	if len(got) != 1 || got[0] != "diffusion_pytorch_model-00002-of-00002.safetensors" {
		t.Fatalf("missing %q, want the second shard", got)
	}
	if err := os.Remove(filepath.Join(dir, "diffusion_pytorch_model-00002-of-00002.safetensors")); err != nil {
		t.Fatal(err)
	}
	write("diffusion_pytorch_model-00002-of-00002.safetensors", "y")
	if got := hfhub.FramePackI2V.Check(dir); len(got) != 0 {
		t.Fatalf("complete folder reports %q missing", got)
	}
	if got := hfhub.HunyuanVideo.Check(dir); len(got) != 11 {
		t.Fatalf("HunyuanVideo in a transformer folder: %d missing %q", len(got), got)
	}
}

// TestPullConcurrent: two pulls into one cache at once (the CLI and a daemon's --pull-missing)
// take turns per blob through the lock files: each blob is downloaded once, both succeed.
func TestPullConcurrent(t *testing.T) {
	f := newFixture(t)
	wants, _ := hfhub.Wants([]string{"i2v"}, "")
	var plans [2]*hfhub.Plan
	var pullers [2]*hfhub.Puller
	for i := range pullers {
		pullers[i] = f.puller("", nil)
		var err error
		if plans[i], err = pullers[i].Plan(t.Context(), wants); err != nil {
			t.Fatal(err)
		}
	}
	errs := make(chan error, 2)
	for i := range pullers {
		go func() { errs <- pullers[i].Pull(t.Context(), plans[i]) }()
	}
	for range pullers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]int{}
	for _, r := range f.hub.Requests() {
		if r.Server == "lfs" && r.Method == "GET" {
			got[r.Path]++
		}
	}
	for p, n := range got {
		if n != 1 {
			t.Errorf("%s downloaded %d times", p, n)
		}
	}
	if v := hfhub.VariantComplete(f.cache.Status("")); !v["i2v"] {
		t.Fatal("i2v incomplete after two concurrent pulls")
	}
}
