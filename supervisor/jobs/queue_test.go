package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/events"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"google.golang.org/protobuf/proto"
)

type runFunc = func(ctx context.Context, job *jobs.Job, emit func(*framepackv1.JobEvent)) (jobs.Result, error)

type env struct {
	store  *jobs.Store
	hub    *events.Hub
	q      *jobs.Queue
	cancel context.CancelFunc
}

func newEnv(t *testing.T, dir string, lanes []string, run runFunc) *env {
	t.Helper()
	s, err := jobs.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	hub, err := events.New(events.Config{Persist: s.AppendEvent, Load: s.Events})
	if err != nil {
		t.Fatal(err)
	}
	q, err := jobs.NewQueue(jobs.Config{Store: s, Lanes: lanes, Run: run, Publish: hub.Publish, Sections: sections})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := q.Start(ctx); err != nil {
		t.Fatal(err)
	}
	e := &env{store: s, hub: hub, q: q, cancel: cancel}
	t.Cleanup(e.stop)
	return e
}

// stop stops the queue at once and closes the store (idempotent).
func (e *env) stop() {
	e.cancel()
	<-e.q.Stopped()
	e.hub.Close()
	e.store.Close()
}

func (e *env) submit(t *testing.T, s *framepackv1.JobSpec) string {
	t.Helper()
	job, err := e.q.Submit(t.Context(), s, pngBytes(t, 8, 8))
	if err != nil {
		t.Fatal(err)
	}
	return job.GetId()
}

// finished waits for each job's terminal event and fails the test unless it is JobFinished.
func (e *env) finished(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if ev := e.terminal(t, id); ev.GetJobFinished() == nil {
			t.Fatalf("job %s: %v", id, ev)
		}
	}
}

// terminal waits for job id's terminal event and returns it.
func (e *env) terminal(t *testing.T, id string) *framepackv1.JobEvent {
	t.Helper()
	history, sub, err := e.hub.Subscribe(id, events.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for _, ev := range history {
		if events.IsTerminal(ev) {
			return ev
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for the end of job %s: %v", id, err)
		}
		if events.IsTerminal(ev) {
			return ev
		}
	}
}

func (e *env) state(t *testing.T, id string) framepackv1.JobState {
	t.Helper()
	job, err := e.store.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	return job.GetState()
}

// gate is a fake Runner whose jobs run until the test releases them or their context ends.
type gate struct {
	started chan *jobs.Job
	mu      sync.Mutex
	release map[string]chan error
	after   chan error // the runner's return value, for tests that look at it
}

func newGate() *gate {
	return &gate{started: make(chan *jobs.Job, 16), release: map[string]chan error{}, after: make(chan error, 16)}
}

func (g *gate) ch(id string) chan error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.release[id] == nil {
		g.release[id] = make(chan error, 1)
	}
	return g.release[id]
}

func (g *gate) run(ctx context.Context, job *jobs.Job, emit func(*framepackv1.JobEvent)) (jobs.Result, error) {
	emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageStarted{StageStarted: &framepackv1.StageStarted{Stage: framepackv1.Stage_STAGE_TEXT_ENCODE, Attempt: 1, Lane: job.Lane}}})
	g.started <- job
	select {
	case err := <-g.ch(job.ID):
		g.after <- err
		if err != nil {
			return jobs.Result{}, err
		}
		return jobs.Result{VideoPath: filepath.Join(job.Dir.Videos(), "final.mp4"), FrameCount: 9}, nil
	case <-ctx.Done():
		// Whatever a runner emits after its context ended must not reach watchers.
		emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageFinished{StageFinished: &framepackv1.StageFinished{Stage: framepackv1.Stage_STAGE_TEXT_ENCODE}}})
		err := context.Cause(ctx)
		g.after <- err
		return jobs.Result{}, err
	}
}

func (g *gate) next(t *testing.T) *jobs.Job {
	t.Helper()
	select {
	case j := <-g.started:
		return j
	case <-time.After(10 * time.Second):
		t.Fatal("no job started")
		return nil
	}
}

func (g *gate) noneStarted(t *testing.T) {
	t.Helper()
	select {
	case j := <-g.started:
		t.Fatalf("job %s started on lane %s", j.ID, j.Lane)
	default:
	}
}

// runningSoon returns q.Running() once lane shows job id, or what it shows after 5 s.
func runningSoon(q *jobs.Queue, lane, id string) map[string]string {
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := q.Running()
		if got[lane] == id || time.Now().After(deadline) {
			return got
		}
		time.Sleep(time.Millisecond)
	}
}

func TestQueueFIFOOneJobPerLane(t *testing.T) {
	g := newGate()
	e := newEnv(t, t.TempDir(), []string{"cpu"}, g.run)
	a, b, c := e.submit(t, spec("a")), e.submit(t, spec("b")), e.submit(t, spec("c"))
	for i, id := range []string{a, b, c} {
		j := g.next(t)
		if j.ID != id {
			t.Fatalf("start %d: job %s, want %s", i, j.ID, id)
		}
		if j.Lane != "cpu" || j.TotalSections != 1 || j.Resume != nil || j.Spec.GetPrompt() != string(rune('a'+i)) {
			t.Fatalf("job given to the runner: %+v", j)
		}
		if b, err := os.ReadFile(j.InputPath); err != nil || len(b) == 0 {
			t.Fatalf("input %s: %v", j.InputPath, err)
		}
		g.noneStarted(t)
		// Running is the loop's copy, refreshed after the loop hands the job to its runner
		if got := runningSoon(e.q, "cpu", id); got["cpu"] != id {
			t.Fatalf("running %v", got)
		}
		if s := e.state(t, id); s != framepackv1.JobState_JOB_STATE_RUNNING {
			t.Fatalf("state %v", s)
		}
		for _, later := range []string{a, b, c}[i+1:] {
			if s := e.state(t, later); s != framepackv1.JobState_JOB_STATE_QUEUED {
				t.Fatalf("job %s: %v while %s runs", later, s, id)
			}
		}
		g.ch(id) <- nil
		ev := e.terminal(t, id)
		if ev.GetJobFinished().GetResult().GetFrameCount() != 9 {
			t.Fatalf("terminal %v", ev)
		}
	}
	job, err := e.store.Get(c)
	if err != nil {
		t.Fatal(err)
	}
	if job.GetState() != framepackv1.JobState_JOB_STATE_SUCCEEDED || job.GetResult().GetDuration() == nil ||
		job.GetProgress().GetFraction() != 1 || job.GetLane() != "cpu" {
		t.Fatalf("finished job %v", job)
	}
	evs, _, err := e.store.Events(c)
	if err != nil || len(evs) != 2 || evs[0].GetStageStarted() == nil || evs[1].GetJobFinished() == nil {
		t.Fatalf("event log %v %v", evs, err)
	}
}

func TestQueueLanes(t *testing.T) {
	g := newGate()
	e := newEnv(t, t.TempDir(), []string{"cuda:0", "cuda:1"}, g.run)
	pinned := func(p string) *framepackv1.JobSpec { s := spec(p); s.Lane = "cuda:1"; return s }
	p1 := e.submit(t, pinned("p1"))
	if j := g.next(t); j.ID != p1 || j.Lane != "cuda:1" {
		t.Fatalf("p1 started as %s on %s", j.ID, j.Lane)
	}
	p2 := e.submit(t, pinned("p2"))
	free := e.submit(t, spec("free"))
	if j := g.next(t); j.ID != free || j.Lane != "cuda:0" {
		t.Fatalf("free job started as %s on %s", j.ID, j.Lane)
	}
	g.noneStarted(t)
	if s := e.state(t, p2); s != framepackv1.JobState_JOB_STATE_QUEUED {
		t.Fatalf("p2 %v while its lane is busy", s)
	}
	g.ch(p1) <- nil
	if j := g.next(t); j.ID != p2 || j.Lane != "cuda:1" {
		t.Fatalf("p2 started as %s on %s", j.ID, j.Lane)
	}
	g.ch(p2) <- nil
	g.ch(free) <- nil
	e.finished(t, p1, p2, free)
}

func TestQueueCancel(t *testing.T) {
	g := newGate()
	e := newEnv(t, t.TempDir(), []string{"cpu"}, g.run)
	a := e.submit(t, spec("a"))
	g.next(t)
	b := e.submit(t, spec("b"))

	// Queued: leaves the queue at once.
	job, err := e.q.Cancel(t.Context(), b, "changed my mind")
	if err != nil || job.GetState() != framepackv1.JobState_JOB_STATE_CANCELLED {
		t.Fatalf("cancel queued: %v %v", job, err)
	}
	if ev := e.terminal(t, b); ev.GetJobCancelled().GetReason() != "changed my mind" {
		t.Fatalf("terminal %v", ev)
	}

	// Running: CANCELLED at once, the runner's context says why.
	job, err = e.q.Cancel(t.Context(), a, "")
	if err != nil || job.GetState() != framepackv1.JobState_JOB_STATE_CANCELLED {
		t.Fatalf("cancel running: %v %v", job, err)
	}
	if err := <-g.after; !errors.Is(err, jobs.ErrCancelled) {
		t.Fatalf("runner's context cause %v", err)
	}
	// The lane is free once the runner returned.
	c := e.submit(t, spec("c"))
	if j := g.next(t); j.ID != c {
		t.Fatalf("next job %s, want %s", j.ID, c)
	}
	evs, _, err := e.store.Events(a)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) == 0 || evs[len(evs)-1].GetJobCancelled() == nil {
		t.Fatalf("job a's log does not end with job_cancelled: %v", evs)
	}
	for _, ev := range evs {
		if ev.GetStageFinished() != nil {
			t.Fatalf("event emitted after cancellation reached the log: %v", evs)
		}
	}

	// Finished: unchanged. Unknown: not found.
	again, err := e.q.Cancel(t.Context(), a, "again")
	if err != nil || again.GetState() != framepackv1.JobState_JOB_STATE_CANCELLED || !proto.Equal(again.GetUpdateTime(), job.GetUpdateTime()) {
		t.Fatalf("cancel cancelled job: %v %v", again, err)
	}
	g.ch(c) <- nil
	e.terminal(t, c)
	done, err := e.q.Cancel(t.Context(), c, "")
	if err != nil || done.GetState() != framepackv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("cancel succeeded job: %v %v", done, err)
	}
	if _, err := e.q.Cancel(t.Context(), "nosuchjob0", ""); !errors.Is(err, jobs.ErrNotFound) {
		t.Fatalf("cancel unknown: %v", err)
	}
}

func TestQueueFailures(t *testing.T) {
	story := &framepackv1.JobFailure{
		Message: "vae decode gave up after 3 attempts", Stage: framepackv1.Stage_STAGE_VAE_DECODE, SectionIndex: 2,
		Attempts: []*framepackv1.Attempt{{Stage: framepackv1.Stage_STAGE_VAE_DECODE, Attempt: 1, Class: framepackv1.AttemptClass_ATTEMPT_CLASS_OOM, Change: "vae tile 256 -> 128 px"}},
	}
	for _, tc := range []struct {
		name string
		run  runFunc
		want *framepackv1.JobFailure
	}{
		{
			name: "failure error keeps the story",
			run: func(context.Context, *jobs.Job, func(*framepackv1.JobEvent)) (jobs.Result, error) {
				return jobs.Result{}, fmt.Errorf("run: %w", &jobs.FailureError{Failure: story})
			},
			want: story,
		},
		{
			name: "plain error takes stage and section from progress",
			run: func(_ context.Context, _ *jobs.Job, emit func(*framepackv1.JobEvent)) (jobs.Result, error) {
				emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageStarted{StageStarted: &framepackv1.StageStarted{Stage: framepackv1.Stage_STAGE_TRANSFORMER, SectionIndex: 1}}})
				return jobs.Result{}, errors.New("transformer: worker exited with signal 9")
			},
			want: &framepackv1.JobFailure{Message: "transformer: worker exited with signal 9", Stage: framepackv1.Stage_STAGE_TRANSFORMER, SectionIndex: 1},
		},
		{
			name: "panic is a failure, not a crash",
			run: func(context.Context, *jobs.Job, func(*framepackv1.JobEvent)) (jobs.Result, error) {
				var m map[string]int
				m["x"]++
				return jobs.Result{}, nil
			},
			want: &framepackv1.JobFailure{Message: "runner panicked: assignment to entry in nil map"},
		},
		{
			name: "success without a video",
			run: func(context.Context, *jobs.Job, func(*framepackv1.JobEvent)) (jobs.Result, error) {
				return jobs.Result{}, nil
			},
			want: &framepackv1.JobFailure{Message: "runner returned no video"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, t.TempDir(), []string{"cpu"}, tc.run)
			id := e.submit(t, spec("x"))
			ev := e.terminal(t, id)
			if !proto.Equal(ev.GetJobFailed().GetFailure(), tc.want) {
				t.Fatalf("terminal %v, want failure %v", ev, tc.want)
			}
			job, err := e.store.Get(id)
			if err != nil || job.GetState() != framepackv1.JobState_JOB_STATE_FAILED || !proto.Equal(job.GetFailure(), tc.want) {
				t.Fatalf("stored %v %v", job, err)
			}
		})
	}
}

// sectionRunner is a fake Runner that works through the sections of a job the way the
// pipeline must: history file, checkpoint, section_video event; it blocks after section
// stopAfter until its context ends.
type sectionRunner struct {
	mu        sync.Mutex
	sections  []int // every section run, in order
	resumes   []*jobs.Checkpoint
	stopAfter int
	reached   chan struct{} // closed when stopAfter is done
	returned  chan error
	honour    bool // return ErrInterrupted when draining
}

func (r *sectionRunner) run(ctx context.Context, job *jobs.Job, emit func(*framepackv1.JobEvent)) (jobs.Result, error) {
	defer func() {}()
	r.mu.Lock()
	r.resumes = append(r.resumes, job.Resume)
	r.mu.Unlock()
	start := 0
	if job.Resume != nil {
		start = job.Resume.Section + 1
	}
	var video string
	for s := start; s < job.TotalSections; s++ {
		emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageStarted{StageStarted: &framepackv1.StageStarted{Stage: framepackv1.Stage_STAGE_TRANSFORMER, SectionIndex: uint32(s)}}})
		hist := filepath.Join("history", fmt.Sprintf("latents-%d.safetensors", s))
		if err := os.WriteFile(filepath.Join(job.Dir.Path(), hist), []byte{byte(s)}, 0o644); err != nil {
			return jobs.Result{}, err
		}
		video = filepath.Join(job.Dir.Videos(), fmt.Sprintf("section-%d.mp4", s))
		if err := os.WriteFile(video, []byte("mp4"), 0o644); err != nil {
			return jobs.Result{}, err
		}
		if err := job.SaveCheckpoint(jobs.Checkpoint{Section: s, Sections: job.TotalSections, Files: map[string]string{"latents": hist}, VideoPath: video}); err != nil {
			return jobs.Result{}, err
		}
		emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_SectionVideo{SectionVideo: &framepackv1.SectionVideo{SectionIndex: uint32(s), Path: video}}})
		r.mu.Lock()
		r.sections = append(r.sections, s)
		r.mu.Unlock()
		if s == r.stopAfter {
			close(r.reached)
			var err error
			select {
			case <-ctx.Done():
				err = context.Cause(ctx)
			case <-job.Draining:
				if !r.honour {
					<-ctx.Done()
					err = context.Cause(ctx)
				} else {
					err = jobs.ErrInterrupted
				}
			}
			// Half-written output of the interrupted stage: the queue removes it.
			_ = os.WriteFile(filepath.Join(job.Dir.Videos(), "next.mp4.partial"), nil, 0o644)
			r.returned <- err
			return jobs.Result{}, err
		}
	}
	return jobs.Result{VideoPath: video, FrameCount: 4*job.TotalSections*int(job.Spec.GetLatentWindowSize()) - 3}, nil
}

func newSectionRunner(stopAfter int, honour bool) *sectionRunner {
	return &sectionRunner{stopAfter: stopAfter, reached: make(chan struct{}), returned: make(chan error, 1), honour: honour}
}

func TestQueueRestartResumesFromCheckpoint(t *testing.T) {
	dir := t.TempDir()
	first := newSectionRunner(1, false)
	e := newEnv(t, dir, []string{"cpu"}, first.run)
	s := spec("long")
	s.TotalSecondLength = 5 // 4 sections
	id := e.submit(t, s)
	<-first.reached
	e.stop() // the daemon goes away mid-job
	if err := <-first.returned; !errors.Is(err, jobs.ErrShutdown) {
		t.Fatalf("runner's context cause %v", err)
	}

	second := newSectionRunner(-1, false)
	e2 := newEnv(t, dir, []string{"cpu"}, second.run)
	ev := e2.terminal(t, id)
	if ev.GetJobFinished() == nil {
		t.Fatalf("terminal %v", ev)
	}
	if got := append(first.sections, second.sections...); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Fatalf("sections run %v, want each of 0..3 once", got)
	}
	if len(second.resumes) != 1 || second.resumes[0] == nil || second.resumes[0].Section != 1 ||
		second.resumes[0].Files["latents"] != filepath.Join("history", "latents-1.safetensors") {
		t.Fatalf("resume point %+v", second.resumes)
	}
	// The history of the first run is still in the job's log, before the second run's events.
	evs, _, err := e2.store.Events(id)
	if err != nil {
		t.Fatal(err)
	}
	var videos []uint32
	for _, ev := range evs {
		if v := ev.GetSectionVideo(); v != nil {
			videos = append(videos, v.GetSectionIndex())
		}
	}
	if !slices.Equal(videos, []uint32{0, 1, 2, 3}) {
		t.Fatalf("section videos in the log %v", videos)
	}
	if _, err := os.Stat(filepath.Join(e2.store.JobDir(id).Videos(), "next.mp4.partial")); !os.IsNotExist(err) {
		t.Errorf("partial file of the interrupted run kept: %v", err)
	}
}

func TestQueueDrain(t *testing.T) {
	for _, tc := range []struct {
		name   string
		honour bool
		grace  time.Duration
		cause  error
	}{
		{name: "runner stops at the boundary", honour: true, grace: time.Minute, cause: jobs.ErrInterrupted},
		{name: "grace runs out", honour: false, grace: 20 * time.Millisecond, cause: jobs.ErrShutdown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			r := newSectionRunner(0, tc.honour)
			e := newEnv(t, dir, []string{"cpu"}, r.run)
			s := spec("x")
			s.TotalSecondLength = 3 // 2 sections
			id := e.submit(t, s)
			<-r.reached
			queued := e.submit(t, spec("waits"))
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if err := e.q.Drain(ctx, tc.grace); err != nil {
				t.Fatal(err)
			}
			if err := <-r.returned; !errors.Is(err, tc.cause) {
				t.Fatalf("runner returned %v, want %v", err, tc.cause)
			}
			<-e.q.Stopped()
			for _, j := range []string{id, queued} {
				if st := e.state(t, j); st != framepackv1.JobState_JOB_STATE_QUEUED {
					t.Fatalf("job %s is %v after drain, want queued", j, st)
				}
			}
			if _, err := e.q.Submit(t.Context(), spec("late"), pngBytes(t, 2, 2)); !errors.Is(err, jobs.ErrStopped) {
				t.Fatalf("submit after drain: %v", err)
			}
			e.stop()
			// Next start: the interrupted job resumes after section 0, then the queued one runs.
			r2 := newSectionRunner(-1, false)
			e2 := newEnv(t, dir, []string{"cpu"}, r2.run)
			e2.terminal(t, id)
			e2.terminal(t, queued)
			if r2.resumes[0] == nil || r2.resumes[0].Section != 0 || r2.resumes[1] != nil {
				t.Fatalf("resume points %+v", r2.resumes)
			}
		})
	}
}

func TestQueueConfig(t *testing.T) {
	s := openStore(t, t.TempDir())
	run := func(context.Context, *jobs.Job, func(*framepackv1.JobEvent)) (jobs.Result, error) {
		return jobs.Result{}, nil
	}
	pub := func(*framepackv1.JobEvent) error { return nil }
	for _, cfg := range []jobs.Config{
		{Lanes: []string{"cpu"}, Run: run, Publish: pub},
		{Store: s, Lanes: []string{"cpu"}, Publish: pub},
		{Store: s, Lanes: []string{"cpu"}, Run: run},
		{Store: s, Run: run, Publish: pub},
		{Store: s, Lanes: []string{"cpu", "cpu"}, Run: run, Publish: pub},
	} {
		if _, err := jobs.NewQueue(cfg); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
	q, err := jobs.NewQueue(jobs.Config{Store: s, Lanes: []string{"cpu"}, Run: run, Publish: pub})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Submit(t.Context(), spec("x"), pngBytes(t, 2, 2)); !errors.Is(err, jobs.ErrStopped) {
		t.Fatalf("submit before start: %v", err)
	}
}
