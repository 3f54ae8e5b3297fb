package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/hfhub"
	"github.com/framepackd/framepackd/internal/hfhub/hubtest"
	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/testbin"
	"github.com/framepackd/framepackd/supervisor/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// hubFixture is a fake hub serving the tiny models and a private HF_HOME.
type hubFixture struct {
	hub     *hubtest.Hub
	commits map[string]string
	dir     string // short temporary directory (sockets)
	home    string // HF_HOME
	bin     string // the CLI
}

func newHubFixture(t *testing.T) *hubFixture {
	t.Helper()
	root, err := parity.Root()
	if err != nil {
		t.Fatal(err)
	}
	h := hubtest.New()
	t.Cleanup(h.Close)
	commits, err := h.PushFixtures(filepath.Join(root, "models"))
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "fpkpull")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return &hubFixture{hub: h, commits: commits, dir: dir, home: filepath.Join(dir, "hfhome"), bin: testbin.Build(t, "./cmd/framepack")}
}

// env is the environment of a command talking to the fake hub.
func (f *hubFixture) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "HF_") || strings.HasPrefix(k, "HUGGING") || k == "TRANSFORMERS_OFFLINE" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "HF_ENDPOINT="+f.hub.Endpoint(), "HF_HOME="+f.home)
}

// cli runs the CLI with the fake hub's environment (plus extra) and a time limit.
func (f *hubFixture) cli(t *testing.T, limit time.Duration, extra []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, f.bin, args...)
	cmd.Env = append(f.env(), extra...)
	return runResult(t, cmd, args)
}

// TestPullThenGenerate pulls the three repositories from the fake hub with the CLI, lists and
// verifies them, and has a real daemon (real workers) make a short video (one section) from the
// pulled cache.
func TestPullThenGenerate(t *testing.T) {
	f := newHubFixture(t)
	cache := filepath.Join(f.dir, "cache")
	r := f.cli(t, 2*time.Minute, nil, "pull", "--cache", cache, "--variant", "i2v")
	if r.code != 0 || strings.TrimSpace(r.stdout) != cache {
		t.Fatalf("pull: exit %d, stdout %q\n%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"hunyuanvideo-community/HunyuanVideo @ " + f.commits["hunyuanvideo-community/HunyuanVideo"][:12], "done", "--models " + cache} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("pull output lacks %q:\n%s", want, r.stderr)
		}
	}

	r = f.cli(t, time.Minute, nil, "models", "--cache", cache)
	if r.code != 0 || !strings.Contains(r.stdout, "i2v complete") || !strings.Contains(r.stdout, "f1 incomplete") ||
		!strings.Contains(r.stdout, "lllyasviel/FramePackI2V_HY") || !strings.Contains(r.stdout, f.commits["lllyasviel/FramePackI2V_HY"][:12]) {
		t.Fatalf("models: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = f.cli(t, time.Minute, nil, "models", "verify", "--cache", cache)
	if r.code != 0 || strings.Count(r.stdout, ": ok") != 3 {
		t.Fatalf("models verify: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// A real daemon on the pulled cache, the tiny demo job.
	workers := filepath.Join(f.dir, "workers")
	if err := os.MkdirAll(workers, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"probe", "textenc", "vae", "clipvision", "transformer"} {
		if err := os.Symlink(testbin.Build(t, "./workers/"+w), filepath.Join(workers, w)); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(f.dir, "d.sock")
	daemon := exec.Command(testbin.Build(t, "./cmd/framepackd"), "--models", cache, "--state", filepath.Join(f.dir, "state"),
		"--socket", sock, "--workers-dir", workers, "--shm-root", filepath.Join(f.dir, "shm"), "--backend", "cpu", "--lanes", "cpu",
		"--log-format", "json", "--grace", "2s")
	daemon.Env = f.env()
	logs := &testbin.Output{}
	daemon.Stderr = logs
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = daemon.Process.Signal(syscall.SIGTERM)
		_ = daemon.Wait()
	})
	conn, err := grpc.NewClient(api.Addr{Network: "unix", Address: sock}.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("daemon not serving: %v %v\n%s", resp, err, logs.String())
	}
	snapshot := filepath.Join(cache, hfhub.RepoFolder("lllyasviel/FramePackI2V_HY"), "snapshots", f.commits["lllyasviel/FramePackI2V_HY"])
	out := filepath.Join(f.dir, "out.mp4")
	image, err := filepath.Abs(filepath.Join("..", "..", "testdata", "demo", "start.png"))
	if err != nil {
		t.Fatal(err)
	}
	r = f.cli(t, 5*time.Minute, []string{"FRAMEPACK_ADDR=" + sock}, "generate", "--image", image, "--prompt", "The girl dances gracefully.",
		"--seconds", "0.4", "--window", "3", "--steps", "2", "--resolution", "96", "--teacache=false", "--quiet", "--out", out)
	if r.code != 0 {
		t.Fatalf("generate: exit %d\n%s\ndaemon:\n%s", r.code, r.stderr, logs.String())
	}
	if !strings.Contains(logs.String(), `"msg":"models found"`) || !strings.Contains(logs.String(), snapshot) {
		t.Errorf("daemon did not load the pulled snapshot %s:\n%s", snapshot, logs.String())
	}
	if got := ffprobeFrames(t, out); got == "" {
		t.Fatalf("video %s has no frames", out)
	} else {
		t.Logf("video from the pulled cache: %s", got)
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestPullKilledThenResumed kills a pull process in the middle of a file; the next pull resumes
// the partial blob with a Range request and the result verifies.
func TestPullKilledThenResumed(t *testing.T) {
	f := newHubFixture(t)
	cache := filepath.Join(f.dir, "cache")
	const repo, file, stallAt = "hunyuanvideo-community/HunyuanVideo", "text_encoder/model.safetensors", 3 << 20
	f.hub.SetFault(repo, file, &hubtest.Fault{StallAt: stallAt, Times: 1})
	cmd := exec.Command(f.bin, "pull", "--cache", cache, "--jobs", "2")
	cmd.Env = f.env()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.hub.Stalled():
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatal("the pull never reached the stalled file")
	}
	// The stalled bytes reach the partial blob; then the pull is killed.
	weights, err := os.ReadFile(filepath.Join(mustRoot(t), "models", "hunyuanvideo", filepath.FromSlash(file)))
	if err != nil {
		t.Fatal(err)
	}
	partial := hfhub.Cache{Root: cache}.BlobPath(repo, sha256Hex(weights)) + ".incomplete"
	deadline := time.Now().Add(30 * time.Second)
	for {
		if st, err := os.Stat(partial); err == nil && st.Size() == stallAt {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partial blob %s never reached %d bytes", partial, stallAt)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	r := f.cli(t, 2*time.Minute, nil, "pull", "--cache", cache)
	if r.code != 0 {
		t.Fatalf("second pull: exit %d\n%s", r.code, r.stderr)
	}
	var ranges []string
	for _, req := range f.hub.Requests() {
		if req.Server == "lfs" && req.Method == "GET" && strings.HasSuffix(req.Path, sha256Hex(weights)) {
			ranges = append(ranges, req.Range)
		}
	}
	if len(ranges) != 2 || ranges[1] != "bytes=3145728-" {
		t.Fatalf("requests' ranges %q, want the second to resume at %d", ranges, stallAt)
	}
	got, err := os.ReadFile(filepath.Join(cache, hfhub.RepoFolder(repo), "snapshots", f.commits[repo], filepath.FromSlash(file)))
	if err != nil || !bytes.Equal(got, weights) {
		t.Fatalf("resumed file differs: %v", err)
	}
	if r := f.cli(t, time.Minute, nil, "models", "verify", "--cache", cache); r.code != 0 {
		t.Fatalf("verify after resume: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestPullErrors: what the CLI says and exits with when the hub refuses or the disk is full.
func TestPullErrors(t *testing.T) {
	f := newHubFixture(t)
	f.hub.SetGated("lllyasviel/flux_redux_bfl", true)
	cache := filepath.Join(f.dir, "cache")
	r := f.cli(t, time.Minute, nil, "pull", "--cache", cache)
	if r.code != exitRejected || !strings.Contains(r.stderr, "HF_TOKEN") || !strings.Contains(r.stderr, "lllyasviel/flux_redux_bfl") {
		t.Fatalf("gated: exit %d\n%s", r.code, r.stderr)
	}
	f.hub.AddToken("hf_ok", true)
	f.hub.SetFault("hunyuanvideo-community/HunyuanVideo", "vae/config.json", &hubtest.Fault{Status: 404})
	r = f.cli(t, time.Minute, []string{"HF_TOKEN=hf_ok"}, "pull", "--cache", cache)
	if r.code != exitNotFound || !strings.Contains(r.stderr, "vae/config.json") {
		t.Fatalf("404: exit %d\n%s", r.code, r.stderr)
	}
	r = f.cli(t, time.Minute, nil, "pull", "--variant", "t2v")
	if r.code != exitUsage || !strings.Contains(r.stderr, "i2v, f1") {
		t.Fatalf("bad variant: exit %d\n%s", r.code, r.stderr)
	}
	r = f.cli(t, time.Minute, []string{"HF_HUB_OFFLINE=1"}, "pull", "--cache", cache)
	if r.code != exitError || !strings.Contains(r.stderr, "HF_HUB_OFFLINE") {
		t.Fatalf("offline: exit %d\n%s", r.code, r.stderr)
	}
}

func mustRoot(t *testing.T) string {
	t.Helper()
	root, err := parity.Root()
	if err != nil {
		t.Fatal(err)
	}
	return root
}
