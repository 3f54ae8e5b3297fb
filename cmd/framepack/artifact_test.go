package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/supervisor/jobs"
)

// TestGetAndRm: `framepack get` downloads a finished job's video over the API (byte for byte,
// resuming a partial download), `framepack rm` deletes finished jobs and refuses running ones,
// and generate checks --out before it submits anything.
func TestGetAndRm(t *testing.T) {
	f := setup(t)
	r := f.cli(t, "generate", "--image", f.image, "--prompt", "x", "--seconds", "1", "--steps", "2", "--detach")
	id := strings.TrimSpace(r.stdout)
	if r.code != exitOK || id == "" {
		t.Fatalf("detach: exit %d %q %s", r.code, r.stdout, r.stderr)
	}
	if r := f.cli(t, "watch", id, "--quiet"); r.code != exitOK {
		t.Fatalf("watch: exit %d %s", r.code, r.stderr)
	}
	job, err := f.d.Store().Get(id)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(job.GetResult().GetVideoPath())
	if err != nil || len(want) < 100 {
		t.Fatalf("server's video: %d bytes, %v", len(want), err)
	}

	out := filepath.Join(t.TempDir(), "got.mp4")
	r = f.cli(t, "get", id, "-o", out)
	if r.code != exitOK || strings.TrimSpace(r.stdout) != out {
		t.Fatalf("get: exit %d %q %s", r.code, r.stdout, r.stderr)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, want) {
		t.Fatalf("downloaded %d bytes differ from the server's %d", len(got), len(want))
	}
	// Resume: a partial file with the first bytes is completed, not restarted.
	out2 := filepath.Join(t.TempDir(), "resumed.mp4")
	if err := os.WriteFile(out2+".partial", want[:len(want)/3], 0o644); err != nil {
		t.Fatal(err)
	}
	r = f.cli(t, "get", id, "--out", out2)
	if got, _ := os.ReadFile(out2); r.code != exitOK || !bytes.Equal(got, want) {
		t.Fatalf("resumed get: exit %d, %d bytes, %s", r.code, len(got), r.stderr)
	}
	if !strings.Contains(r.stderr, "saved") {
		t.Errorf("stderr %q", r.stderr)
	}
	unknown := filepath.Join(t.TempDir(), "unknown.mp4")
	if r := f.cli(t, "get", "zzzzzzzzzz", "-o", unknown); r.code != exitNotFound {
		t.Fatalf("get unknown: exit %d %s", r.code, r.stderr)
	}
	if _, err := os.Stat(unknown + ".partial"); !os.IsNotExist(err) {
		t.Fatalf("empty partial file left by a failed get: %v", err)
	}

	// A running job cannot be removed; a finished one goes with its folder.
	r = f.cli(t, "generate", "--image", f.image, "--prompt", "block here", "--detach")
	running := strings.TrimSpace(r.stdout)
	f.waitBlocked(t)
	if r := f.cli(t, "rm", running); r.code != exitRejected || !strings.Contains(r.stderr, "cancel it first") {
		t.Fatalf("rm running: exit %d %s", r.code, r.stderr)
	}
	dir := f.d.Store().JobDir(id).Path()
	if r := f.cli(t, "rm", id); r.code != exitOK || !strings.Contains(r.stdout, "deleted") {
		t.Fatalf("rm: exit %d %q %s", r.code, r.stdout, r.stderr)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("job folder after rm: %v", err)
	}
	if r := f.cli(t, "get", id, "-o", unknown); r.code != exitNotFound {
		t.Fatalf("get after rm: exit %d %s", r.code, r.stderr)
	}
	if r := f.cli(t, "cancel", running); r.code != exitOK {
		t.Fatalf("cancel: %d %s", r.code, r.stderr)
	}

	// --out is checked before the job is submitted.
	before, _, err := f.d.Store().List(jobsAll())
	if err != nil {
		t.Fatal(err)
	}
	r = f.cli(t, "generate", "--image", f.image, "--prompt", "x", "--out", filepath.Join(f.dir, "no", "such", "dir", "v.mp4"))
	if r.code != exitUsage || !strings.Contains(r.stderr, "does not exist") {
		t.Fatalf("bad --out: exit %d %s", r.code, r.stderr)
	}
	after, _, _ := f.d.Store().List(jobsAll())
	if len(after) != len(before) {
		t.Fatalf("a job was submitted despite the bad --out: %d jobs, were %d", len(after), len(before))
	}
}

func jobsAll() jobs.ListOptions { return jobs.ListOptions{PageSize: 1000} }

// TestGenerateRejectsOutOfRange: 0 and other out-of-range settings are refused with the
// allowed range before anything is sent (the API reads 0 as "the default", so --steps 0 used
// to run 25 steps).
func TestGenerateRejectsOutOfRange(t *testing.T) {
	f := setup(t)
	out := filepath.Join(f.dir, "x.mp4")
	for _, tc := range []struct{ flag, value, want string }{
		{"--steps", "0", "--steps must be 1 to 100, got 0"},
		{"--window", "0", "--window must be 1 to 33, got 0"},
		{"--cfg", "0", "--cfg must be 1 to 32, got 0"},
		{"--gs", "0", "--gs must be 1 to 32, got 0"},
	} {
		r := f.cli(t, "generate", "--image", f.image, "--prompt", "p", "--out", out, tc.flag, tc.value)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s %s: exit %d, stderr %q, want %q", tc.flag, tc.value, r.code, r.stderr, tc.want)
		}
	}
	if list, _, _ := f.d.Store().List(jobsAll()); len(list) != 0 {
		t.Fatalf("%d jobs submitted", len(list))
	}
}
