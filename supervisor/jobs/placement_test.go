package jobs_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/events"
	"github.com/framepackd/framepackd/supervisor/jobs"
)

// fakeHealth is a lane's health that the test sets.
type fakeHealth struct {
	mu      sync.Mutex
	reason  string // empty: ready
	changed chan struct{}
}

func newFakeHealth(reason string) *fakeHealth {
	return &fakeHealth{reason: reason, changed: make(chan struct{})}
}

func (h *fakeHealth) Ready() (bool, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reason == "", h.reason
}

func (h *fakeHealth) Changed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

func (h *fakeHealth) set(reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reason = reason
	close(h.changed)
	h.changed = make(chan struct{})
}

// newPlacedEnv is newEnv with a Placement.
func newPlacedEnv(t *testing.T, lanes []string, run runFunc, p jobs.Placement) *env {
	t.Helper()
	s, err := jobs.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	hub, err := events.New(events.Config{Persist: s.AppendEvent, Load: s.Events})
	if err != nil {
		t.Fatal(err)
	}
	q, err := jobs.NewQueue(jobs.Config{Store: s, Lanes: lanes, Run: run, Publish: hub.Publish, Placement: p, Sections: sections})
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

func expectStart(t *testing.T, g *gate, id, lane string) {
	t.Helper()
	if j := g.next(t); j.ID != id || j.Lane != lane {
		t.Fatalf("started %s on %s, want %s on %s", j.ID, j.Lane, id, lane)
	}
}

// TestPlacementHeldLaneSkipped: a held lane takes no job and blocks no other lane; jobs wait for
// a free ready lane and start on the held lane once it is released; a job pinned to the held
// lane waits without holding back the jobs behind it.
func TestPlacementHeldLaneSkipped(t *testing.T) {
	g := newGate()
	held := newFakeHealth("held: vram not back")
	e := newPlacedEnv(t, []string{"cuda:0", "cuda:1"}, g.run, jobs.Placement{
		Health: func(lane string) jobs.LaneHealth {
			if lane == "cuda:0" {
				return held
			}
			return nil
		},
	})
	pinned := spec("pinned")
	pinned.Lane = "cuda:0"
	p := e.submit(t, pinned)
	a := e.submit(t, spec("a"))
	expectStart(t, g, a, "cuda:1")
	b := e.submit(t, spec("b"))
	g.noneStarted(t)
	for _, id := range []string{p, b} {
		if s := e.state(t, id); s != framepackv1.JobState_JOB_STATE_QUEUED {
			t.Fatalf("job %s is %v while cuda:0 is held and cuda:1 busy", id, s)
		}
	}
	held.set("") // the memory came back
	expectStart(t, g, p, "cuda:0")
	g.ch(a) <- nil
	expectStart(t, g, b, "cuda:1")
	g.ch(p) <- nil
	g.ch(b) <- nil
	e.finished(t, p, a, b)
}

// TestPlacementLeastLoadedWithMemory: a job goes to the free lane with the most free memory, a
// lane short of the job's memory is passed over, and a job that fits no lane waits until
// memory is freed (seen at the next recheck) while later jobs that fit go ahead.
func TestPlacementLeastLoadedWithMemory(t *testing.T) {
	g := newGate()
	var free0, free1 atomic.Uint64
	free0.Store(10 << 30)
	free1.Store(20 << 30)
	e := newPlacedEnv(t, []string{"cuda:0", "cuda:1"}, g.run, jobs.Placement{
		FreeBytes: func(lane string) (uint64, bool) {
			if lane == "cuda:0" {
				return free0.Load(), true
			}
			return free1.Load(), true
		},
		TotalBytes: func(string) (uint64, bool) { return 24 << 30, true },
		NeedBytes: func(s *framepackv1.JobSpec) uint64 {
			switch s.GetPrompt() {
			case "big":
				return 16 << 30
			case "huge":
				return 32 << 30
			}
			return 6 << 30
		},
		Recheck: 20 * time.Millisecond,
	})
	a := e.submit(t, spec("a"))
	expectStart(t, g, a, "cuda:1")    // 20 GiB free beats 10
	huge := e.submit(t, spec("huge")) // more than any lane has: fails at once, blocks nothing
	if ev := e.terminal(t, huge); !strings.Contains(ev.GetJobFailed().GetFailure().GetMessage(), "needs 32.0 GiB") {
		t.Fatalf("huge job: %v", ev)
	}
	big := e.submit(t, spec("big"))
	small := e.submit(t, spec("small"))
	expectStart(t, g, small, "cuda:0") // big does not fit cuda:0's 10 GiB; small does
	g.noneStarted(t)
	g.ch(small) <- nil
	if ev := e.terminal(t, small); ev.GetJobFinished() == nil {
		t.Fatalf("small: %v", ev)
	}
	if s := e.state(t, big); s != framepackv1.JobState_JOB_STATE_QUEUED {
		t.Fatalf("big is %v with no lane of 16 GiB free", s)
	}
	free0.Store(18 << 30) // another process let go of its memory
	expectStart(t, g, big, "cuda:0")
	g.ch(a) <- nil
	g.ch(big) <- nil
	e.finished(t, a, big)
}

// TestPlacementFIFOWithinLane: the jobs pinned to one lane start in submission order while the
// other lane runs the unpinned ones in theirs.
func TestPlacementFIFOWithinLane(t *testing.T) {
	g := newGate()
	e := newPlacedEnv(t, []string{"cpu:0", "cpu:1"}, g.run, jobs.Placement{})
	var pinned, loose []string
	for _, name := range []string{"p1", "p2", "p3"} {
		s := spec(name)
		s.Lane = "cpu:1"
		pinned = append(pinned, e.submit(t, s))
		loose = append(loose, e.submit(t, spec("l"+name)))
	}
	// p1 takes cpu:1, l1 cpu:0; then each lane takes its next job in order as it frees.
	expectStart(t, g, pinned[0], "cpu:1")
	expectStart(t, g, loose[0], "cpu:0")
	for i := 1; i < 3; i++ {
		g.ch(pinned[i-1]) <- nil
		expectStart(t, g, pinned[i], "cpu:1")
		g.ch(loose[i-1]) <- nil
		expectStart(t, g, loose[i], "cpu:0")
	}
	g.ch(pinned[2]) <- nil
	g.ch(loose[2]) <- nil
	e.finished(t, append(pinned, loose...)...)
}
