package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/events"
	"github.com/framepackd/framepackd/supervisor/jobs"
)

// pngHeader is enough of a PNG for the store to name the input input.png.
var pngHeader = []byte("\x89PNG\r\n\x1a\n0000IHDR")

func testSpec() *framepackv1.JobSpec {
	return jobs.WithDefaults(&framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 1, Resolution: 96})
}

// takeOne takes a job from c's queue, waiting up to 20 s.
func takeOne(t *testing.T, c *Cluster) (string, jobs.Lease) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		id, l, err := c.queue.Take(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if l != nil {
			return id, l
		}
	}
	t.Fatal("no job taken in 20 s")
	return "", nil
}

// TestStoreAcrossDaemons: a job submitted through one daemon is read through another, with its
// video paths in each daemon's own working copy; List pages newest first; one client request
// id sent through two daemons at once makes one job.
func TestStoreAcrossDaemons(t *testing.T) {
	url := natsServer(t)
	a, b := join(t, url, "a", time.Minute), join(t, url, "b", time.Minute)
	var ids []string
	for range 3 {
		job, err := a.store.Create(testSpec(), pngHeader)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, job.GetId())
	}
	page, next, err := b.store.List(jobs.ListOptions{PageSize: 2})
	if err != nil || len(page) != 2 || next == "" || page[0].GetId() != ids[2] || page[1].GetId() != ids[1] {
		t.Fatalf("first page %v next %q (%v), want %v newest first", page, next, err, ids)
	}
	page, next, err = b.store.List(jobs.ListOptions{PageSize: 2, PageToken: next})
	if err != nil || len(page) != 1 || next != "" || page[0].GetId() != ids[0] {
		t.Fatalf("second page %v next %q (%v)", page, next, err)
	}
	if _, err := b.store.Get("0000000000"); !errors.Is(err, jobs.ErrNotFound) {
		t.Fatalf("unknown job: %v", err)
	}

	// A path written by a: b reports it in its own working copy.
	id := ids[0]
	if _, err := a.store.Update(id, func(j *framepackv1.Job) error {
		j.Progress = &framepackv1.JobProgress{LatestVideoPath: filepath.Join(a.store.JobDir(id).Videos(), "section-000.mp4")}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got, err := b.store.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(b.store.JobDir(id).Videos(), "section-000.mp4"); got.GetProgress().GetLatestVideoPath() != want {
		t.Errorf("video path through b %q, want %q", got.GetProgress().GetLatestVideoPath(), want)
	}

	req := jobs.ClientRequest{ID: "request one", Hash: "h1"}
	var wg sync.WaitGroup
	made := make([]*framepackv1.Job, 2)
	errs := make([]error, 2)
	for i, c := range []*Cluster{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			made[i], _, errs[i] = c.store.CreateOnce(req, testSpec(), pngHeader)
		}()
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil || made[0].GetId() != made[1].GetId() {
		t.Fatalf("one client request id through two daemons: %v %v, jobs %s %s", errs[0], errs[1], made[0].GetId(), made[1].GetId())
	}
	if _, err := b.store.JobForRequest(jobs.ClientRequest{ID: req.ID, Hash: "other"}); !errors.Is(err, jobs.ErrRequestMismatch) {
		t.Errorf("same id, other request: %v", err)
	}
}

// TestLeaseTakeOverAndFencing: a daemon that stops renewing its hold on a job loses it to
// another after the ack wait, and its later writes are refused (jobs.ErrLeaseLost); a job
// cancelled through another daemon ends the running daemon's lease.
func TestLeaseTakeOverAndFencing(t *testing.T) {
	url := natsServer(t)
	const ackWait = 2 * time.Second
	a, b := join(t, url, "a", ackWait), join(t, url, "b", ackWait)
	job, err := a.store.Create(testSpec(), pngHeader)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.queue.Put(t.Context(), job.GetId()); err != nil {
		t.Fatal(err)
	}
	id, la := takeOne(t, a)
	if id != job.GetId() {
		t.Fatalf("took %s, want %s", id, job.GetId())
	}
	if _, err := a.store.Update(id, func(j *framepackv1.Job) error {
		j.State, j.Lane = framepackv1.JobState_JOB_STATE_RUNNING, "cpu"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if j, _ := b.store.Get(id); j.GetLane() != "a/cpu" {
		t.Errorf("lane %q, want a/cpu", j.GetLane())
	}
	la.(*lease).stop() // a stops answering (renewal and watch), as a daemon that hangs

	idb, lb := takeOne(t, b) // redelivered after the ack wait
	if idb != id {
		t.Fatalf("b took %s, want %s", idb, id)
	}
	if _, err := a.store.Update(id, func(j *framepackv1.Job) error { return nil }); !errors.Is(err, jobs.ErrLeaseLost) {
		t.Fatalf("a's update after b took over: %v, want ErrLeaseLost", err)
	}
	if err := os.MkdirAll(a.store.JobDir(id).Path(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.store.JobDir(id).Path(), "input.png"), pngHeader, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.store.SaveCheckpoint(id, jobs.Checkpoint{Section: 0, Sections: 2, Files: map[string]string{"x": "input.png"}}); !errors.Is(err, jobs.ErrLeaseLost) {
		t.Fatalf("a's checkpoint after b took over: %v, want ErrLeaseLost", err)
	}
	if _, err := b.store.Update(id, func(j *framepackv1.Job) error { return nil }); err != nil {
		t.Fatalf("b's update: %v", err)
	}

	// Cancelled through a (no lease there): b's lease is lost.
	if _, err := a.store.Update(id, func(j *framepackv1.Job) error { j.State = framepackv1.JobState_JOB_STATE_CANCELLED; return nil }); !errors.Is(err, jobs.ErrLeaseLost) {
		// a still holds its stale token: fenced too. Cancel through a third daemon instead.
		t.Logf("a's cancel: %v", err)
	}
	c := join(t, url, "c", ackWait)
	if _, err := c.store.Update(id, func(j *framepackv1.Job) error { j.State = framepackv1.JobState_JOB_STATE_CANCELLED; return nil }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lb.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("b's lease not lost after a cancel through c")
	}
	lb.Done()
}

// TestCheckpointMovesBetweenDaemons: a checkpoint saved by one daemon is prepared on another
// byte for byte, its video served there, and a later checkpoint removes the files it
// supersedes from the cluster.
func TestCheckpointMovesBetweenDaemons(t *testing.T) {
	url := natsServer(t)
	a, b := join(t, url, "a", time.Minute), join(t, url, "b", time.Minute)
	job, err := a.store.Create(testSpec(), pngHeader)
	if err != nil {
		t.Fatal(err)
	}
	id := job.GetId()
	if err := a.queue.Put(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	_, la := takeOne(t, a)
	pa, err := a.store.Prepare(id)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(pa.InputPath); err != nil || string(b) != string(pngHeader) {
		t.Fatalf("input on a: %q %v", b, err)
	}
	write := func(rel, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(pa.Dir.Path(), rel), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("history/conditioning.safetensors", "cond")
	write("history/section-000.safetensors", "hist0")
	write("video/section-000.mp4", "mp4-0")
	write("video/section-000.json", "{}")
	cp := jobs.Checkpoint{Section: 0, Sections: 2, Variant: "i2v", VideoPath: filepath.Join(pa.Dir.Videos(), "section-000.mp4"), FrameCount: 9,
		Files: map[string]string{"conditioning": "history/conditioning.safetensors", "section": "history/section-000.safetensors"}}
	if err := a.store.SaveCheckpoint(id, cp); err != nil {
		t.Fatal(err)
	}
	la.Release(0)

	_, lb := takeOne(t, b)
	defer lb.Done()
	pb, err := b.store.Prepare(id)
	if err != nil {
		t.Fatal(err)
	}
	if pb.Resume == nil || pb.Resume.Section != 0 || pb.Resume.VideoPath != filepath.Join(pb.Dir.Videos(), "section-000.mp4") {
		t.Fatalf("resume on b: %+v", pb.Resume)
	}
	for rel, want := range map[string]string{"history/conditioning.safetensors": "cond", "history/section-000.safetensors": "hist0", "video/section-000.mp4": "mp4-0", "video/section-000.json": "{}"} {
		if got, err := os.ReadFile(filepath.Join(pb.Dir.Path(), rel)); err != nil || string(got) != want {
			t.Errorf("%s on b: %q %v, want %q", rel, got, err, want)
		}
	}
	if err := os.WriteFile(filepath.Join(pb.Dir.Path(), "history/section-001.safetensors"), []byte("hist1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pb.Dir.Videos(), "section-001.mp4"), []byte("mp4-1"), 0o644); err != nil {
		t.Fatal(err)
	}
	cp1 := jobs.Checkpoint{Section: 1, Sections: 2, VideoPath: filepath.Join(pb.Dir.Videos(), "section-001.mp4"),
		Files: map[string]string{"conditioning": "history/conditioning.safetensors", "section": "history/section-001.safetensors"}}
	if err := b.store.SaveCheckpoint(id, cp1); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, gone := range []string{"history/section-000.safetensors", "video/section-000.mp4", "video/section-000.json"} {
		if _, err := b.store.obs.GetInfo(ctx, objectName(id, gone)); err == nil {
			t.Errorf("superseded %s still in the cluster", gone)
		}
	}
	if _, err := b.store.obs.GetInfo(ctx, objectName(id, "history/conditioning.safetensors")); err != nil {
		t.Errorf("conditioning gone from the cluster: %v", err)
	}
	// a serves b's newest video: fetched from the cluster.
	f, err := a.store.OpenVideo(id, filepath.Join(a.store.JobDir(id).Videos(), "section-001.mp4"))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(f)
	f.Close()
	if string(got) != "mp4-1" {
		t.Errorf("video through a: %q", got)
	}
	if _, err := a.store.OpenVideo(id, "/etc/passwd"); err == nil {
		t.Error("a path outside the job directory opened")
	}
}

// TestWatchAcrossDaemons: events published by one daemon reach a watcher on another: the
// history first, then the live ones in order, with the newest telemetry; closing the events
// ends the stream with events.ErrClosed.
func TestWatchAcrossDaemons(t *testing.T) {
	url := natsServer(t)
	a, b := join(t, url, "a", time.Minute), join(t, url, "b", time.Minute)
	job, err := a.store.Create(testSpec(), pngHeader)
	if err != nil {
		t.Fatal(err)
	}
	id := job.GetId()
	step := func(i uint32) *framepackv1.JobEvent {
		return &framepackv1.JobEvent{JobId: id, Event: &framepackv1.JobEvent_SamplingStep{SamplingStep: &framepackv1.SamplingStep{Step: i, TotalSteps: 9}}}
	}
	for i := range uint32(3) {
		if err := a.events.Publish(step(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := b.events.Watch("0000000000", events.SubscribeOptions{}); !errors.Is(err, jobs.ErrNotFound) {
		t.Fatalf("watch of an unknown job: %v", err)
	}
	history, s, err := b.events.Watch(id, events.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if len(history) != 3 || history[2].GetSamplingStep().GetStep() != 2 {
		t.Fatalf("history %v", history)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for i := uint32(3); i < 5; i++ {
		if err := a.events.Publish(step(i)); err != nil {
			t.Fatal(err)
		}
		ev, err := s.Next(ctx)
		if err != nil || ev.GetSamplingStep().GetStep() != i {
			t.Fatalf("live event %d: %v %v", i, ev, err)
		}
	}
	tel := &framepackv1.JobEvent{JobId: id, Event: &framepackv1.JobEvent_MemoryTelemetry{MemoryTelemetry: &framepackv1.MemoryTelemetry{}}}
	if err := a.events.Publish(tel); err != nil {
		t.Fatal(err)
	}
	if ev, err := s.Next(ctx); err != nil || ev.GetMemoryTelemetry() == nil {
		t.Fatalf("telemetry: %v %v", ev, err)
	}
	b.events.Close()
	if _, err := s.Next(ctx); !errors.Is(err, events.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// TestQueueDrainGivesJobBack runs the job queue of two daemons on the cluster with a runner
// that checkpoints section 0 and waits: the daemon that took the job drains, the job goes back
// to the cluster's queue and the other daemon finishes it from its checkpoint.
func TestQueueDrainGivesJobBack(t *testing.T) {
	url := natsServer(t)
	a, b := join(t, url, "a", 3*time.Second), join(t, url, "b", 3*time.Second)
	var mu sync.Mutex
	ranOn := map[string][]string{} // node → resume points seen ("scratch" or the section)
	run := func(node string) func(ctx context.Context, job *jobs.Job, emit func(*framepackv1.JobEvent)) (jobs.Result, error) {
		return func(ctx context.Context, job *jobs.Job, emit func(*framepackv1.JobEvent)) (jobs.Result, error) {
			mu.Lock()
			if job.Resume == nil {
				ranOn[node] = append(ranOn[node], "scratch")
			} else {
				ranOn[node] = append(ranOn[node], fmt.Sprint(job.Resume.Section))
			}
			mu.Unlock()
			video := filepath.Join(job.Dir.Videos(), "final.mp4")
			if err := os.WriteFile(video, []byte("v"), 0o644); err != nil {
				return jobs.Result{}, err
			}
			if job.Resume != nil {
				return jobs.Result{VideoPath: video, FrameCount: 1}, nil
			}
			if err := job.SaveCheckpoint(jobs.Checkpoint{Section: 0, Sections: 2, VideoPath: video}); err != nil {
				return jobs.Result{}, err
			}
			emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_SectionVideo{SectionVideo: &framepackv1.SectionVideo{Path: video}}})
			select {
			case <-job.Draining:
				return jobs.Result{}, jobs.ErrInterrupted
			case <-ctx.Done():
				return jobs.Result{}, context.Cause(ctx)
			}
		}
	}
	queue := func(c *Cluster) *jobs.Queue {
		q, err := jobs.NewQueue(jobs.Config{Store: c.store, Shared: c.queue, Lanes: []string{"cpu"}, Run: run(c.cfg.Node), Publish: c.events.Publish})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	qa := queue(a)
	if err := qa.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	job, err := qa.Submit(t.Context(), testSpec(), pngHeader)
	if err != nil {
		t.Fatal(err)
	}
	id := job.GetId()
	_, s, err := a.events.Watch(id, events.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for {
		ev, err := s.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetSectionVideo() != nil {
			break
		}
	}
	if err := qa.Drain(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	qb := queue(b)
	if err := qb.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := s.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetJobFinished() != nil {
			break
		}
		if events.IsTerminal(ev) {
			t.Fatalf("job ended with %v", ev)
		}
	}
	got, err := a.store.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got.GetState() != framepackv1.JobState_JOB_STATE_SUCCEEDED || got.GetLane() != "b/cpu" ||
		fmt.Sprint(ranOn["a"]) != "[scratch]" || fmt.Sprint(ranOn["b"]) != "[0]" {
		t.Fatalf("job %v on %q; runs %v", got.GetState(), got.GetLane(), ranOn)
	}
	if !proto.Equal(got.GetSpec(), testSpec()) {
		t.Errorf("spec changed: %v", got.GetSpec())
	}
}
