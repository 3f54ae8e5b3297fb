package main

// Issue 32's CLI items ("first use and faults, round three"), each against a real daemon on a
// unix socket (supervisor/api with the fake runner below the process boundary).

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/testbin"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/pipeline"
)

// tinyModels is what the daemon knows of the tiny test models (testdata/parity/models).
func tinyModels(t *testing.T) api.ModelFit {
	t.Helper()
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	m, err := pipeline.ResolveModels(filepath.Join(root, "testdata", "parity", "models"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := pipeline.CheckModels(m)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// TestGenerateFollowsServedModels: generate without --resolution runs at the served models'
// resolution (it sent 640, which ran the tiny models for many minutes on a CPU), an explicit
// --resolution 640 on them is refused saying what to use, and the seed left out is the one the
// server gives every client.
func TestGenerateFollowsServedModels(t *testing.T) {
	fit := tinyModels(t)
	f := setupWith(t, func(c *api.DaemonConfig) { c.Models = func() api.ModelFit { return fit } })
	r := f.cli(t, "generate", "--image", f.image, "--prompt", "a cat", "--seconds", "1", "--steps", "1", "--detach")
	id := strings.TrimSpace(r.stdout)
	if r.code != exitOK {
		t.Fatalf("generate without --resolution: exit %d %s", r.code, r.stderr)
	}
	job, err := f.d.Store().Get(id)
	if err != nil || job.GetSpec().GetResolution() != 96 || job.GetSpec().GetSeed() != 31337 {
		t.Fatalf("job without --resolution: %v %v", job.GetSpec(), err)
	}
	out := filepath.Join(f.dir, "at640.mp4")
	r = f.cli(t, "generate", "--image", f.image, "--prompt", "a cat", "--resolution", "640", "--out", out)
	if r.code != exitRejected || !strings.Contains(r.stderr, "resolution 640 does not fit them: use 96 (framepack generate --resolution 96") {
		t.Fatalf("generate --resolution 640 on the tiny models: exit %d %s", r.code, r.stderr)
	}
	if r := f.cli(t, "generate", "--image", f.image, "--prompt", "a cat", "--resolution", "0", "--out", out); r.code != exitUsage {
		t.Fatalf("--resolution 0: exit %d %s", r.code, r.stderr)
	}
}

// TestNotServing: a daemon that answers but cannot run jobs says why on every surface: health
// prints the reason, devices shows the lane not serving with it, and generate fails at once
// with the server's reason, not "cannot reach the server". Once ready, health serves again.
func TestNotServing(t *testing.T) {
	const why = "no variant can run: framepack: resolve models in /m: hunyuanvideo-community/HunyuanVideo not found"
	var broken atomic.Bool
	broken.Store(true)
	f := setupWith(t, func(c *api.DaemonConfig) {
		c.ReadyInterval = 50 * time.Millisecond
		c.Ready = func() error {
			if broken.Load() {
				return errors.New(why)
			}
			return nil
		}
	})
	r := f.cli(t, "health")
	if r.code != exitUnhealthy || strings.TrimSpace(r.stdout) != "NOT_SERVING: "+why {
		t.Fatalf("health: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = f.cli(t, "devices")
	if r.code != exitOK || !strings.Contains(r.stdout, "not_serving ("+why+")") || strings.Contains(r.stdout, "healthy") ||
		!strings.Contains(r.stderr, "the server does not run jobs now: "+why) {
		t.Fatalf("devices: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	start := time.Now()
	r = f.cli(t, "generate", "--image", f.image, "--prompt", "p", "--out", filepath.Join(f.dir, "x.mp4"))
	if r.code != exitUnhealthy || !strings.HasPrefix(r.stderr, "framepack: the server cannot run jobs now: "+why) ||
		strings.Contains(r.stderr, "cannot reach") || strings.Contains(r.stderr, "reconnecting") {
		t.Fatalf("generate: exit %d, stderr %q", r.code, r.stderr)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("generate took %v to report a server that cannot run jobs", d)
	}
	broken.Store(false)
	deadline := time.Now().Add(20 * time.Second)
	for {
		r = f.cli(t, "health")
		if r.code == exitOK && strings.TrimSpace(r.stdout) == "SERVING" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health once ready: exit %d %q", r.code, r.stdout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestNoDaemon: without a daemon, watch and generate fail within seconds naming the address
// they tried (watch printed "reconnecting" for a minute, generate took 30 s).
func TestNoDaemon(t *testing.T) {
	f := setup(t)
	nobody := filepath.Join(f.dir, "nobody.sock")
	for _, args := range [][]string{
		{"watch", "zzzzzzzzzz", "--addr", nobody},
		{"generate", "--image", f.image, "--prompt", "p", "--out", filepath.Join(f.dir, "x.mp4"), "--addr", nobody},
		{"--addr", nobody, "jobs"},
	} {
		start := time.Now()
		r := f.cli(t, args...)
		took := time.Since(start)
		if r.code != exitUnreachable || !strings.Contains(r.stderr, "cannot reach the server at "+nobody+": ") || strings.Contains(r.stderr, "reconnecting") {
			t.Errorf("%v: exit %d, stderr %q", args[0], r.code, r.stderr)
		}
		if took > 10*time.Second {
			t.Errorf("%v took %v to give up", args, took)
		}
	}
}

// TestDetachHints: the re-attach command printed on SIGTERM names the --addr (and --out) it
// needs; when the server is down at that moment the message does not claim the job keeps
// running.
func TestDetachHints(t *testing.T) {
	f := setup(t)
	out := filepath.Join(f.dir, "bg.mp4")
	detach := func(serverDown bool) string {
		t.Helper()
		gen := f.command(t, "generate", "--addr", f.addr, "--image", f.image, "--prompt", "block here", "--out", out)
		stderr := &watchedBuffer{want: "text encode started", seen: make(chan struct{})}
		gen.Stderr = stderr
		if err := gen.Start(); err != nil {
			t.Fatal(err)
		}
		id := f.waitBlocked(t)
		stderr.wait(t) // the stream is open
		if serverDown {
			f.d.Kill()
			lost := time.Now().Add(30 * time.Second)
			for !strings.Contains(stderr.String(), "reconnecting") && time.Now().Before(lost) {
				time.Sleep(20 * time.Millisecond)
			}
		}
		if err := gen.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		_ = gen.Wait()
		if code := gen.ProcessState.ExitCode(); code != exitDetached ||
			!strings.Contains(stderr.String(), "Re-attach with: framepack watch "+id+" --addr "+f.addr+" --out "+out+"\n") {
			t.Fatalf("after SIGTERM: exit %d, stderr:\n%s", code, stderr.String())
		}
		if !serverDown {
			if r := f.cli(t, "cancel", id); r.code != exitOK { // the lane is free for the next job
				t.Fatalf("cancel: %d %s", r.code, r.stderr)
			}
		}
		return stderr.String()
	}
	if msg := detach(false); !strings.Contains(msg, "it keeps running on the server") {
		t.Errorf("detached from a running server:\n%s", msg)
	}
	if msg := detach(true); strings.Contains(msg, "keeps running") || !strings.Contains(msg, "while the server at "+f.addr+" cannot be reached") {
		t.Errorf("detached while the server is down:\n%s", msg)
	}
}

// TestOverwriteNeedsForce: get -o, generate --out and watch --out refuse an existing file
// unless --force (generate before it submits anything).
func TestOverwriteNeedsForce(t *testing.T) {
	f := setup(t)
	r := f.cli(t, "generate", "--image", f.image, "--prompt", "x", "--seconds", "1", "--steps", "1", "--detach")
	id := strings.TrimSpace(r.stdout)
	if r := f.cli(t, "watch", id, "--quiet"); r.code != exitOK {
		t.Fatalf("watch: exit %d %s", r.code, r.stderr)
	}
	existing := filepath.Join(f.dir, "mine.mp4")
	precious := []byte("a file the user cares about")
	if err := os.WriteFile(existing, precious, 0o644); err != nil {
		t.Fatal(err)
	}
	before, _, _ := f.d.Store().List(jobsAll())
	for _, args := range [][]string{
		{"get", id, "-o", existing},
		{"watch", id, "--out", existing},
		{"generate", "--image", f.image, "--prompt", "x", "--out", existing},
	} {
		r := f.cli(t, args...)
		if got, _ := os.ReadFile(existing); r.code != exitUsage || !strings.Contains(r.stderr, existing+" exists; give another name, or --force to overwrite it") || !bytes.Equal(got, precious) {
			t.Errorf("%v: exit %d %q, file now %d bytes", args, r.code, r.stderr, len(got))
		}
	}
	if after, _, _ := f.d.Store().List(jobsAll()); len(after) != len(before) {
		t.Errorf("generate submitted a job although --out exists")
	}
	r = f.cli(t, "get", id, "-o", existing, "--force")
	if got, _ := os.ReadFile(existing); r.code != exitOK || bytes.Equal(got, precious) || len(got) < 100 {
		t.Fatalf("get --force: exit %d %s, %d bytes", r.code, r.stderr, len(got))
	}
}

// TestVideoSoFarAndRm: the "video so far" line gives the command that downloads it (the
// server removes a section's MP4 when the next is written, so its path was a dead end), and rm
// of a running job says how to cancel it.
func TestVideoSoFarAndRm(t *testing.T) {
	f := setup(t)
	r := f.cli(t, "generate", "--image", f.image, "--prompt", "a cat", "--seconds", "2.4", "--steps", "1", "--out", filepath.Join(f.dir, "v.mp4"))
	if r.code != exitOK {
		t.Fatalf("generate: exit %d %s", r.code, r.stderr)
	}
	list, _, _ := f.d.Store().List(jobsAll())
	id := list[0].GetId()
	want := "section 1/2: video so far: 3 frames (download: framepack get " + id + " --addr " + f.addr + ")\n"
	if !strings.Contains(r.stderr, want) || strings.Contains(r.stderr, id+"_3.mp4") {
		t.Fatalf("generate's output lacks %q (or names the first section's file):\n%s", want, r.stderr)
	}

	r = f.cli(t, "generate", "--image", f.image, "--prompt", "block here", "--detach")
	running := strings.TrimSpace(r.stdout)
	f.waitBlocked(t)
	r = f.cli(t, "rm", running)
	if want := "framepack: job " + running + " has not finished; cancel it first (framepack cancel " + running + " --addr " + f.addr + ")\n"; r.code != exitRejected || r.stderr != want {
		t.Fatalf("rm of a running job: exit %d %q, want %q", r.code, r.stderr, want)
	}
	if r := f.cli(t, "cancel", running); r.code != exitOK {
		t.Fatalf("cancel: %d %s", r.code, r.stderr)
	}
}

// TestVersionStamped: the CLI that make builds names its version and commit, not "devel" (a
// git worktree, or -buildvcs=false, gives the Go toolchain no commit to embed).
func TestVersionStamped(t *testing.T) {
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	head, err := exec.Command("git", "-C", root, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	bin := t.TempDir()
	if out, err := exec.Command("make", "-s", "-C", root, "BIN="+bin, "cli").CombinedOutput(); err != nil {
		t.Fatalf("make cli: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(bin, "framepack"), "--version").Output()
	v := string(out)
	if err != nil || !strings.HasPrefix(v, "framepack v") || strings.Contains(v, "devel") || !strings.Contains(v, "(commit "+strings.TrimSpace(string(head))) {
		t.Fatalf("--version: %v %q (HEAD %s)", err, v, head)
	}
}
