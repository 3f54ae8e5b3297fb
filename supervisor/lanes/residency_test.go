package lanes_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/supervisor/lanes"
)

const mib = 1 << 20

// keepStage is a stage that asks to be kept, under the job budget budget, with need.
func keepStage(m lanes.Model, job string, budget uint64, need *lanes.Need) lanes.Stage {
	st := stage(m, "ok")
	st.JobID, st.MemoryCap, st.Need, st.Keep = job, budget, need, true
	return st
}

func run(t *testing.T, l *lanes.Lane, st lanes.Stage) lanes.Report {
	t.Helper()
	rep, err := l.Run(t.Context(), st)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func models(rs []lanes.Resident) []lanes.Model {
	var out []lanes.Model
	for _, r := range rs {
		out = append(out, r.Model)
	}
	return out
}

// TestKeepWhereCapsFit: with residency on, a worker asking to be kept stays alive while the
// caps of the live workers (each beyond the first costing the overhead) fit the job's budget;
// a stage whose cap does not fit beside them kills the least recently used first; a kept
// worker serves the next stage of its model with its load key, without spawn or load.
func TestKeepWhereCapsFit(t *testing.T) {
	l := newLane(t, func(c *lanes.Config) { c.Residency, c.WorkerOverhead = true, 10*mib })
	need := &lanes.Need{Min: 50 * mib, Full: 100 * mib} // cap: 100 + 12.5 + 256 MiB
	c := need.Cap()
	budget := 3*c + 2*10*mib // three workers fit, a fourth does not
	a := run(t, l, keepStage(lanes.TextEnc, "j1", budget, need))
	b := run(t, l, keepStage(lanes.VAE, "j1", budget, need))
	cl := run(t, l, keepStage(lanes.ClipVision, "j1", budget, need))
	for _, r := range []lanes.Report{a, b, cl} {
		if !r.Kept || r.Reused || r.CapBytes != c || !alive(r.PID) || len(r.Evicted) != 0 {
			t.Fatalf("%s: kept %v reused %v cap %d alive %v evicted %v; want kept at cap %d", r.Model, r.Kept, r.Reused, r.CapBytes, alive(r.PID), r.Evicted, c)
		}
	}
	// The VAE again: the kept worker serves it.
	b2 := run(t, l, keepStage(lanes.VAE, "j1", budget, need))
	if !b2.Reused || b2.PID != b.PID || b2.SpawnToReady != 0 || b2.Load != 0 {
		t.Fatalf("vae not reused: %+v", b2)
	}
	// A fourth model does not fit beside three: the least recently used (textenc) goes.
	d := run(t, l, keepStage(lanes.Transformer, "j1", budget, need))
	if !slices.Equal(d.Evicted, []lanes.Model{lanes.TextEnc}) || alive(a.PID) {
		t.Fatalf("evicted %v (textenc alive %v), want textenc killed", d.Evicted, alive(a.PID))
	}
	if got := models(l.Residents()); !slices.Equal(got, []lanes.Model{lanes.ClipVision, lanes.Transformer, lanes.VAE}) {
		t.Fatalf("residents %v", got)
	}
	// A stage without an estimate takes the whole budget: every kept worker goes.
	e := run(t, l, keepStage(lanes.TextEnc, "j1", budget, nil))
	if len(e.Evicted) != 3 || e.CapBytes != budget || !e.Kept {
		t.Fatalf("stage without estimate: evicted %v cap %d kept %v; want all three evicted, the budget %d", e.Evicted, e.CapBytes, e.Kept, budget)
	}
	for _, r := range []lanes.Report{b, cl, d} {
		if alive(r.PID) {
			t.Fatalf("%s worker %d alive after eviction", r.Model, r.PID)
		}
	}
	// A job with a smaller budget: the kept worker's cap does not fit, so it is not reused.
	f := run(t, l, keepStage(lanes.TextEnc, "j2", budget/2, nil))
	if f.Reused || alive(e.PID) || f.CapBytes != budget/2 {
		t.Fatalf("smaller budget: reused %v, old worker alive %v, cap %d", f.Reused, alive(e.PID), f.CapBytes)
	}
	l.Release("j2", 0)
	if len(l.Residents()) != 0 || alive(f.PID) {
		t.Fatal("release with no keep-alive left a worker")
	}
	noChildren(t)
}

// TestNoKeepWithoutProof: residency off, no Keep, or no budget (unknown memory): every worker is
// killed after its stage.
func TestNoKeepWithoutProof(t *testing.T) {
	need := &lanes.Need{Min: mib, Full: 2 * mib}
	for _, tc := range []struct {
		name      string
		residency bool
		st        lanes.Stage
	}{
		{"residency off", false, keepStage(lanes.VAE, "j", 1<<30, need)},
		{"not asked", true, func() lanes.Stage { s := keepStage(lanes.VAE, "j", 1<<30, need); s.Keep = false; return s }()},
		{"no budget", true, keepStage(lanes.VAE, "j", 0, need)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLane(t, func(c *lanes.Config) { c.Residency = tc.residency })
			rep := run(t, l, tc.st)
			if rep.Kept || alive(rep.PID) || len(l.Residents()) != 0 {
				t.Fatalf("kept %v alive %v residents %v (%s)", rep.Kept, alive(rep.PID), l.Residents(), rep.Decision)
			}
		})
	}
	noChildren(t)
}

// TestReuseNeedsSameLoad: a kept worker serves only a stage with its model folder, LoRAs and
// workload, and a cap its own fits in; any other is a fresh worker and the old one goes.
func TestReuseNeedsSameLoad(t *testing.T) {
	l := newLane(t, func(c *lanes.Config) { c.Residency = true })
	need := &lanes.Need{Min: mib, Full: 2 * mib}
	first := run(t, l, keepStage(lanes.Transformer, "j", 1<<30, need))
	for _, change := range []func(*lanes.Stage){
		func(s *lanes.Stage) { s.Loras = []workerkit.LoraSpec{{Path: "/l.safetensors", Strength: 1}} },
		func(s *lanes.Stage) { s.Workload = &workerkit.Workload{Height: 64, Width: 96, LatentWindowSize: 3} },
		func(s *lanes.Stage) { s.ModelDir = "/models/other" },
		func(s *lanes.Stage) { s.Load.MaxResidentBlocks = 2 }, // a retry's rung
	} {
		st := keepStage(lanes.Transformer, "j", 1<<30, need)
		change(&st)
		rep := run(t, l, st)
		if rep.Reused || alive(first.PID) {
			t.Fatalf("changed stage reused %v, old worker alive %v", rep.Reused, alive(first.PID))
		}
		first = rep
	}
	// A larger cap than the stage may have now: not reused.
	big := keepStage(lanes.VAE, "j", 1<<30, nil) // the whole budget
	b := run(t, l, big)
	small := keepStage(lanes.VAE, "j", 1<<30, need)
	if rep := run(t, l, small); rep.Reused || alive(b.PID) || rep.CapBytes != need.Cap() {
		t.Fatalf("a worker capped at the whole budget served a stage capped at %d: %+v", need.Cap(), rep)
	}
	l.Release("j", 0)
	noChildren(t)
}

// TestKeepAlive: Release gives the job's kept workers a keep-alive; they serve the next job and
// are killed when it runs out; KeepAliveAuto is the lane's KeepAlive, or 0 for a job whose
// workers were killed to make room; Unload kills kept workers at once.
func TestKeepAlive(t *testing.T) {
	l := newLane(t, func(c *lanes.Config) { c.Residency, c.KeepAlive = true, time.Hour })
	need := &lanes.Need{Min: mib, Full: 2 * mib}
	budget := uint64(1 << 30)
	a := run(t, l, keepStage(lanes.TextEnc, "j1", budget, need))
	if got := l.Release("j1", lanes.KeepAliveAuto); got != time.Hour {
		t.Fatalf("auto keep-alive %v, want the lane's hour", got)
	}
	rs := l.Residents()
	if len(rs) != 1 || rs[0].Expires.IsZero() || rs[0].Job != "j1" || rs[0].PID != a.PID {
		t.Fatalf("residents after release %+v", rs)
	}
	// The next job reuses it, and its stage takes the worker over.
	b := run(t, l, keepStage(lanes.TextEnc, "j2", budget, need))
	if !b.Reused || b.PID != a.PID {
		t.Fatalf("next job did not reuse the kept worker: %+v", b)
	}
	if rs := l.Residents(); len(rs) != 1 || !rs[0].Expires.IsZero() || rs[0].Job != "j2" {
		t.Fatalf("residents while j2 runs %+v", rs)
	}
	// A short keep-alive runs out.
	l.Release("j2", 150*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for (len(l.Residents()) > 0 || alive(a.PID)) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if len(l.Residents()) != 0 || alive(a.PID) {
		t.Fatalf("keep-alive ran out, worker still kept %v or alive %v", l.Residents(), alive(a.PID))
	}
	// A job whose stage had to kill a kept worker of its own: auto means 0.
	run(t, l, keepStage(lanes.TextEnc, "j3", 3*need.Cap(), need))
	run(t, l, keepStage(lanes.VAE, "j3", 3*need.Cap(), &lanes.Need{Min: mib, Full: 2 * need.Cap()}))
	if got := l.Release("j3", lanes.KeepAliveAuto); got != 0 || len(l.Residents()) != 0 {
		t.Fatalf("contested job: keep-alive %v, residents %v; want 0 and none", got, l.Residents())
	}
	// Unload.
	run(t, l, keepStage(lanes.TextEnc, "j4", budget, need))
	run(t, l, keepStage(lanes.VAE, "j4", budget, need))
	l.Release("j4", time.Hour)
	if got := l.Unload(lanes.VAE); !slices.Equal(got, []lanes.Model{lanes.VAE}) {
		t.Fatalf("unload vae: %v", got)
	}
	if got := models(l.Residents()); !slices.Equal(got, []lanes.Model{lanes.TextEnc}) {
		t.Fatalf("residents after unloading the vae: %v", got)
	}
	if got := l.Unload(); !slices.Equal(got, []lanes.Model{lanes.TextEnc}) {
		t.Fatalf("unload all: %v", got)
	}
	noChildren(t)
}

// fakeRecovery records the lane's recovery checks.
type fakeRecovery struct {
	mu     sync.Mutex
	reads  int
	checks []int
}

func (f *fakeRecovery) Baseline(context.Context) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	return 42, nil
}

func (f *fakeRecovery) Check(_ context.Context, baseline uint64, pgid int) (bool, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if baseline == 42 {
		f.checks = append(f.checks, pgid)
	}
	return true, ""
}

// TestRecoveryAfterKeptKill: the baseline is read when no worker lives and one spawns; killing
// the last kept worker outside a stage checks that memory came back to it.
func TestRecoveryAfterKeptKill(t *testing.T) {
	rec := &fakeRecovery{}
	l := newLane(t, func(c *lanes.Config) { c.Residency, c.Recovery = true, rec })
	need := &lanes.Need{Min: mib, Full: 2 * mib}
	a := run(t, l, keepStage(lanes.TextEnc, "j", 1<<30, need))
	b := run(t, l, keepStage(lanes.VAE, "j", 1<<30, need)) // a worker lives: no new baseline
	l.Unload(lanes.TextEnc)                                // the VAE still lives: no check
	l.Unload(lanes.VAE)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.reads != 1 || !slices.Equal(rec.checks, []int{b.PID}) {
		t.Fatalf("baseline reads %d, checks after %v; want one read and a check after the vae (%d), not the textenc (%d)", rec.reads, rec.checks, b.PID, a.PID)
	}
}

// TestEstimate: the lane asks a throwaway worker for the estimate, caches it by request, and
// reports a worker without one.
func TestEstimate(t *testing.T) {
	var starts int
	var mu sync.Mutex
	l := newLane(t, func(c *lanes.Config) {
		c.Start = func(ctx context.Context, cfg workerkit.Config) (lanes.Proc, error) {
			mu.Lock()
			starts++
			mu.Unlock()
			return workerkit.Start(ctx, cfg)
		}
	})
	st := stage(lanes.VAE, "ok")
	for range 2 {
		n, err := l.Estimate(t.Context(), st, 5)
		if err != nil || n != (lanes.Need{Min: 100 * mib, Full: 205 * mib}) {
			t.Fatalf("estimate %+v, %v", n, err)
		}
	}
	if n, err := l.Estimate(t.Context(), st, 7); err != nil || n.Full != 207*mib {
		t.Fatalf("another decode size: %+v, %v", n, err)
	}
	if starts != 2 {
		t.Fatalf("%d workers started for three estimates of two requests", starts)
	}
	st.ModelDir = "/models/vae-noest"
	if _, err := l.Estimate(t.Context(), st, 5); err == nil {
		t.Fatal("a failing estimate answered")
	}
	noChildren(t)
}

// TestMemoryLimit: the lane's limit bounds every job's budget.
func TestMemoryLimit(t *testing.T) {
	l := newLane(t, func(c *lanes.Config) { c.DeviceMemory, c.MemoryLimit = 141<<30, 6<<30 })
	if got, err := l.MemoryCap(6 << 30); err != nil || got != 6<<30 {
		t.Fatalf("budget %d, %v; want the 6 GiB limit", got, err)
	}
	l = newLane(t, func(c *lanes.Config) { c.DeviceMemory, c.MemoryLimit = 24<<30, 20<<30 })
	if got, err := l.MemoryCap(6 << 30); err != nil || got != 24<<30-6<<30-lanes.DefaultReserve {
		t.Fatalf("budget %d, %v; want the device less preservation and reserve", got, err)
	}
	l = newLane(t, func(c *lanes.Config) { c.MemoryLimit = 8 << 30 })
	if got, err := l.MemoryCap(6 << 30); err != nil || got != 8<<30 {
		t.Fatalf("unknown device, limit 8 GiB: %d, %v", got, err)
	}
	if _, err := newLane(t, func(c *lanes.Config) { c.DeviceMemory, c.MemoryLimit = 8<<30, 4<<30 }).MemoryCap(7 << 30); !errors.Is(err, lanes.ErrNoMemoryLeft) {
		t.Fatalf("7 of 8 GiB preserved: %v", err)
	}
}
