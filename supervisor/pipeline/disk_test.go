package pipeline_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/shm/shmtest"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/lanes"
	"github.com/framepackd/framepackd/supervisor/pipeline"
)

func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// TestDiskFullMidJob: the disk fills up before the third section; the job fails saying so,
// with the second section as its last video and checkpoint, nothing half-written, and the
// store readable. Along the way each section's MP4 replaced the one before (one video and one
// section history on disk at a time).
func TestDiskFullMidJob(t *testing.T) {
	workers := buildWorkers(t)
	o := newOpts(t, workers)
	models, err := pipeline.ResolveModels(o.Models)
	if err != nil {
		t.Fatal(err)
	}
	root := shmtest.Root(t)
	laneName, backend := testLane()
	log := testLogger()
	lane, err := lanes.New(lanes.Config{Name: laneName, Backend: backend, Log: logrus.NewEntry(log),
		WorkerPath: func(m lanes.Model) (string, error) { return workers[m], nil }})
	if err != nil {
		t.Fatal(err)
	}
	var full atomic.Bool
	var videosAtSection1 []string
	var store *jobs.Store
	runner, err := pipeline.New(pipeline.Config{Models: models, Shm: root, Log: log, NoPreviews: true,
		Lane: func(string) (*lanes.Lane, error) { return lane, nil },
		FreeBytes: func(dir string) (uint64, error) {
			if full.Load() {
				return 4 << 10, nil
			}
			return 1 << 40, nil
		},
		OnStage: func(r pipeline.StageRecord) {
			if r.Stage == framepackv1.Stage_STAGE_WRITE_VIDEO && r.Section == 1 && r.Err == "" {
				videosAtSection1 = names(t, filepath.Join(store.JobDir(r.Job).Videos()))
				full.Store(true) // the next section finds the disk full
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := api.StartDaemon(api.DaemonConfig{StateDir: o.State, Listen: []api.Addr{{Network: "unix", Address: o.Socket}},
		Lanes: []string{laneName}, Run: runner.Run, Grace: time.Second, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Kill()
	store = d.Store()
	c := client(t, o.Socket)
	img := pngOf(t, make([]int64, 3*96*64), 96, 64)
	resp, err := c.SubmitJob(t.Context(), &framepackv1.SubmitJobRequest{Image: img, Spec: &framepackv1.JobSpec{Prompt: "a cat",
		TotalSecondLength: 1.2, LatentWindowSize: 3, Steps: 2, Resolution: 96, UseTeacache: proto.Bool(false)}})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetJob().GetId()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	last, err := watch(ctx, c, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := last.GetJobFailed().GetFailure()
	if f == nil || !strings.Contains(f.GetMessage(), "disk full") || !strings.Contains(f.GetMessage(), "section 2 as its last video") {
		t.Fatalf("last event %v", last)
	}
	// The video so far after section 1: its settings, its parts (joined when a client reads it)
	// and the segments; section 0's is superseded.
	wantVideos := []string{"section-001.json", "section-001.mp4.parts.json", "segments", "thumbnail.jpg"}
	if !slices.Equal(videosAtSection1, wantVideos) {
		t.Errorf("videos after section 1: %v, want only the newest %v (section 0's is superseded)", videosAtSection1, wantVideos)
	}
	dir := store.JobDir(id)
	if got := names(t, dir.Videos()); !slices.Equal(got, wantVideos) {
		t.Errorf("videos after the failure: %v", got)
	}
	hist := names(t, dir.History())
	if !slices.Contains(hist, pipeline.SectionFile(1)) || slices.Contains(hist, pipeline.SectionFile(2)) || slices.Contains(hist, pipeline.SectionFile(0)) {
		t.Errorf("history after the failure: %v, want only section 1's checkpoint", hist)
	}
	cp, err := store.Checkpoint(id)
	if err != nil || cp == nil || cp.Section != 1 {
		t.Fatalf("checkpoint %+v %v", cp, err)
	}
	for _, rel := range cp.Files {
		if _, err := os.Stat(filepath.Join(dir.Path(), rel)); err != nil {
			t.Errorf("checkpoint file %s: %v", rel, err)
		}
	}
	if p := partials(dir.Path()); len(p) > 0 {
		t.Errorf("partial files left: %v", p)
	}
	job, err := store.Get(id)
	if err != nil || job.GetProgress().GetLatestVideoPath() != filepath.Join(dir.Videos(), "section-001.mp4") {
		t.Fatalf("job after the failure: %v %v", job, err)
	}
}
