package main

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/testbin"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// withWorkers puts every model worker next to the probe in the fixture's workers folder and
// points --models at the tiny test models.
func (f *daemonFixture) withWorkers(t *testing.T) {
	t.Helper()
	for _, w := range []string{"textenc", "vae", "clipvision", "transformer"} {
		if err := os.Symlink(testbin.Build(t, "./workers/"+w), filepath.Join(f.workers, w)); err != nil {
			t.Fatal(err)
		}
	}
	f.withModels(t)
}

// withModels gives the daemon the tiny test models (it serves: its lanes are not
// NOT_SERVING), without the workers that run them.
func (f *daemonFixture) withModels(t *testing.T) {
	t.Helper()
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "testdata", "parity", "models"), filepath.Join(f.dir, "models")); err != nil {
		t.Fatal(err)
	}
}

// tinyJobRequest is a short job on the tiny test models.
func tinyJobRequest(t *testing.T) *framepackv1.SubmitJobRequest {
	t.Helper()
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	img, err := os.ReadFile(filepath.Join(root, "testdata", "demo", "start.png"))
	if err != nil {
		t.Fatal(err)
	}
	tea := false
	return &framepackv1.SubmitJobRequest{Image: img, Spec: &framepackv1.JobSpec{Prompt: "a cat", TotalSecondLength: 0.4,
		LatentWindowSize: 3, Steps: 2, Resolution: 96, UseTeacache: &tea}}
}

// runJob submits req and watches it to its terminal event.
func runJob(t *testing.T, c framepackv1.JobServiceClient, req *framepackv1.SubmitJobRequest) *framepackv1.JobEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	resp, err := c.SubmitJob(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := c.WatchJob(ctx, &framepackv1.WatchJobRequest{JobId: resp.GetJob().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	var last *framepackv1.JobEvent
	for {
		ev, err := stream.Recv()
		if err != nil {
			return last
		}
		last = ev
	}
}

// TestTwoDaemonsShareShmRoot is issue 15's first item: two daemons of one user under one
// shared-memory root; stopping one must not break the other (it used to remove the root and
// every later job of the other daemon failed).
func TestTwoDaemonsShareShmRoot(t *testing.T) {
	base := shmtest.Dir()
	t.Cleanup(func() { os.RemoveAll(base) })
	a := newFixture(t)
	a.withWorkers(t)
	a.shmRoot = base
	b := newFixture(t)
	b.withWorkers(t)
	b.shmRoot = base

	// A private temporary directory with what older versions left behind: old leftovers go at
	// start, a young one (maybe a live process's) stays.
	tmp, err := os.MkdirTemp("", "fpt") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	old := time.Now().Add(-2 * time.Hour)
	for _, n := range []string{"plugin-dir123", "fpk_gpu_conv-abc", "fpws456", "plugin-dir-young"} {
		if err := os.Mkdir(filepath.Join(tmp, n), 0o700); err != nil {
			t.Fatal(err)
		}
		if n != "plugin-dir-young" {
			if err := os.Chtimes(filepath.Join(tmp, n), old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	a.env = []string{"TMPDIR=" + tmp}
	b.env = a.env

	acmd, alogs, _ := a.start(t, "--lanes", "cpu")
	bcmd, blogs, bconn := b.start(t, "--lanes", "cpu")
	entries, err := os.ReadDir(base)
	if err != nil || len(entries) != 2 {
		t.Fatalf("want one folder per daemon in %s: %v %v", base, entries, err)
	}
	stop(t, acmd, alogs)

	last := runJob(t, framepackv1.NewJobServiceClient(bconn), tinyJobRequest(t))
	if last.GetJobFinished() == nil {
		t.Fatalf("job on the daemon that kept running: %v\nlogs:\n%s", last, blogs.String())
	}
	if _, err := os.Stat(last.GetJobFinished().GetResult().GetVideoPath()); err != nil {
		t.Fatalf("video: %v", err)
	}
	entries, err = os.ReadDir(base)
	if err != nil || len(entries) != 1 {
		t.Fatalf("after one daemon stopped, want only the other's folder in %s: %v %v", base, entries, err)
	}
	// Temporary files: the workers' socket folders lived in the daemon's own temporary
	// folder, which goes with it; nothing else is left.
	stop(t, bcmd, blogs)
	var left []string
	_ = filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err == nil && p != tmp {
			left = append(left, strings.TrimPrefix(p, tmp+"/"))
		}
		return nil
	})
	want := []string{"framepackd-" + strconv.Itoa(os.Getuid()), "plugin-dir-young"}
	if !slices.Equal(left, want) {
		t.Fatalf("temporary directory after both daemons stopped: %v, want %v", left, want)
	}
}
