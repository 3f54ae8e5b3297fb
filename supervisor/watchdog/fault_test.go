package watchdog_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/lanes"
	"github.com/framepackd/framepackd/supervisor/watchdog"
)

// kindOf is the stage kind of a lane stage's request.
func kindOf(st lanes.Stage) framepackv1.Stage {
	switch st.Request.(type) {
	case *workerkit.TextEncodeRequest:
		return framepackv1.Stage_STAGE_TEXT_ENCODE
	case *workerkit.VAEEncodeRequest:
		return framepackv1.Stage_STAGE_VAE_ENCODE
	case *workerkit.VAEDecodeRequest:
		return framepackv1.Stage_STAGE_VAE_DECODE
	case *workerkit.ImageEncodeRequest:
		return framepackv1.Stage_STAGE_IMAGE_ENCODE
	}
	return framepackv1.Stage_STAGE_TRANSFORMER
}

// opCount runs st without faults and returns how many ops its worker ran (load and stage) and
// its output.
func opCount(t *testing.T, r *rig, st lanes.Stage, out workerkit.TensorRef) (uint64, []float32) {
	t.Helper()
	var rep lanes.Report
	if err := r.wd.Job("count", nil).Run(t.Context(), watchdog.StageInfo{Kind: kindOf(st)}, r.attempt(st, &rep)); err != nil {
		t.Fatalf("clean run: %v", err)
	}
	var n uint64
	for _, c := range rep.Result.Stats.OpCounts {
		n += c
	}
	v := readF32(t, out)
	os.Remove(out.Path)
	return n, v
}

// faultOnce injects f into the first attempt of every stage only.
func faultOnce(f workerkit.Fault) rigOpts {
	return func(c *watchdog.Config) {
		c.FaultPlan = func(a watchdog.AttemptInfo) *workerkit.Fault {
			if a.Attempt == 1 {
				return &f
			}
			return nil
		}
	}
}

// oomAttempts injects an out-of-memory error at op atOp into the first n attempts of every
// stage and records each attempt's knobs into *knobs.
func oomAttempts(n int, atOp uint64, knobs *[]watchdog.Knobs) rigOpts {
	var mu sync.Mutex
	return func(c *watchdog.Config) {
		c.FaultPlan = func(a watchdog.AttemptInfo) *workerkit.Fault {
			mu.Lock()
			*knobs = append(*knobs, a.Knobs)
			mu.Unlock()
			if a.Attempt <= n {
				return &workerkit.Fault{OOMAtOp: atOp}
			}
			return nil
		}
	}
}

// TestFaultExitSignal: the worker kills itself with a signal mid-stage; the watchdog sees the
// crash, the probe worker finds the device healthy, the retry produces the clean output and the
// dead worker's group is gone.
func TestFaultExitSignal(t *testing.T) {
	base := newRig(t)
	st0, out0 := base.decodeStage(t, 1)
	ops, want := opCount(t, base, st0, out0)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSEGV, syscall.SIGABRT} {
		t.Run(sig.String(), func(t *testing.T) {
			var pids []int
			r := newRig(t, faultOnce(workerkit.Fault{ExitAtOp: ops / 2, ExitSignal: int32(sig)}))
			st, out := r.decodeStage(t, 1)
			var rep lanes.Report
			att := r.attempt(st, &rep)
			err := r.wd.Job("exit", nil).Run(t.Context(), watchdog.StageInfo{Kind: kindOf(st)}, func(ctx context.Context, a *watchdog.Attempt) error {
				err := att(ctx, a)
				pids = append(pids, rep.PID)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			s := r.wd.Stats()
			if c := s.Classes[watchdog.ClassCrash]; c.Detected != 1 || c.Retried != 1 || c.Recovered != 1 {
				t.Fatalf("crash counts %+v", c)
			}
			if s.Probes != 1 || s.ProbeFailures != 0 {
				t.Fatalf("probes %d failures %d", s.Probes, s.ProbeFailures)
			}
			if !equal(readF32(t, out), want) {
				t.Fatal("the retried stage's pixels differ from the clean run's")
			}
			for _, p := range pids {
				groupGone(t, p)
			}
		})
	}
}

// TestFaultHangAtOp: the worker stops advancing its beacon at op N while gRPC keeps answering;
// the watchdog sees the op overdue within its deadline + 2 s, kills the group, and the retry
// succeeds.
func TestFaultHangAtOp(t *testing.T) {
	base := newRig(t)
	st0, out0 := base.textStage(t, "a cat walks")
	ops, want := opCount(t, base, st0, out0)
	r := newRig(t, faultOnce(workerkit.Fault{HangAtOp: ops - 2}))
	st, out := r.textStage(t, "a cat walks")
	var rep lanes.Report
	att := r.attempt(st, &rep)
	var verdict *watchdog.Verdict
	var hungPID int
	err := r.wd.Job("hang", nil).Run(t.Context(), watchdog.StageInfo{Kind: kindOf(st)}, func(ctx context.Context, a *watchdog.Attempt) error {
		err := att(ctx, a)
		if a.Number == 1 {
			verdict, hungPID = a.Verdict(), rep.PID
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if verdict == nil || verdict.Kind != watchdog.VerdictOpOverdue || verdict.Beacon.OpSeq != ops-2 {
		t.Fatalf("verdict %v", verdict)
	}
	late := verdict.At.Sub(verdict.Beacon.OpStart)
	t.Logf("%s; seen %v after the op began (deadline %v)", verdict, late.Round(time.Millisecond), testOp)
	if late > testOp+2*time.Second {
		t.Fatalf("hang seen %v after it began, more than its %v deadline + 2 s", late, testOp)
	}
	if c := r.wd.Stats().Classes[watchdog.ClassHang]; c.Detected != 1 || c.Recovered != 1 {
		t.Fatalf("hang counts %+v", c)
	}
	if hungPID != 0 {
		groupGone(t, hungPID)
	}
	if !equal(readF32(t, out), want) {
		t.Fatal("the retried stage's output differs from the clean run's")
	}
}

// TestFaultOOMAtOp: a typed out-of-memory error at op N; the retry uses smaller VAE tiles
// (256 px) and gives the clean output (the 32 px frames fit one tile).
func TestFaultOOMAtOp(t *testing.T) {
	base := newRig(t)
	st0, out0 := base.decodeStage(t, 2)
	ops, want := opCount(t, base, st0, out0)
	var knobs []watchdog.Knobs
	r := newRig(t, oomAttempts(2, ops/3, &knobs))
	st, out := r.decodeStage(t, 2)
	var rep lanes.Report
	j := r.wd.Job("oom", nil)
	if err := j.Run(t.Context(), watchdog.StageInfo{Kind: kindOf(st)}, r.attempt(st, &rep)); err != nil {
		t.Fatal(err)
	}
	if len(knobs) != 3 || knobs[1].VAETilePx != 256 || knobs[2].VAETilePx != 128 {
		t.Fatalf("knobs of the attempts %+v", knobs)
	}
	story := j.Story()
	if len(story) != 3 || story[0].GetClass() != framepackv1.AttemptClass_ATTEMPT_CLASS_OOM ||
		!strings.Contains(story[0].GetMessage(), "out of memory") || story[1].GetChange() != "vae tile 256 px -> 128 px" {
		t.Fatalf("story %v", story)
	}
	if !equal(readF32(t, out), want) {
		t.Fatal("the retried stage's pixels differ from the clean run's")
	}
}

// TestFaultOOMAtLoad: a worker whose Load runs out of memory (Fault.oom_at_load: its allocator
// refuses the weights) fails that attempt as an out of memory, not a crash; the retry goes one
// rung down the ladder (256 px VAE tiles) and gives the clean run's pixels.
func TestFaultOOMAtLoad(t *testing.T) {
	base := newRig(t)
	st0, out0 := base.decodeStage(t, 2)
	_, want := opCount(t, base, st0, out0)
	r := newRig(t, faultOnce(workerkit.Fault{OOMAtLoad: true}))
	st, out := r.decodeStage(t, 2)
	var rep lanes.Report
	j := r.wd.Job("oom-load", nil)
	if err := j.Run(t.Context(), watchdog.StageInfo{Kind: kindOf(st)}, r.attempt(st, &rep)); err != nil {
		t.Fatal(err)
	}
	story := j.Story()
	if len(story) != 2 || story[0].GetClass() != framepackv1.AttemptClass_ATTEMPT_CLASS_OOM ||
		!strings.Contains(story[0].GetMessage(), "out of memory") || story[0].GetChange() != "vae tile untiled -> 256 px" {
		t.Fatalf("story %v", story)
	}
	if !equal(readF32(t, out), want) {
		t.Fatal("the retried stage's pixels differ from the clean run's")
	}
}

// TestFaultOOMLlamaLayers: a text encoder worker that runs out of memory with its Llama layers
// all resident is retried with half of them resident (as many as its LoadResponse said ran,
// halved), and once a single layer is resident with its memory cap lowered; the worker honours
// both (its LoadResponse says one layer resident, the rest streamed) and the retried stage
// gives the clean run's output bit for bit.
func TestFaultOOMLlamaLayers(t *testing.T) {
	base := newRig(t)
	st0, out0 := base.textStage(t, "a cat walks")
	ops, want := opCount(t, base, st0, out0)
	var knobs []watchdog.Knobs
	r := newRig(t, oomAttempts(2, ops-2, &knobs))
	st, out := r.textStage(t, "a cat walks")
	var rep lanes.Report
	att := r.attempt(st, &rep)
	var ran [][2]uint32 // resident and streamed layers of each attempt
	laneCap := uint64(1 << 30)
	info := watchdog.StageInfo{Kind: kindOf(st), MemoryCap: laneCap, Small: true}
	j := r.wd.Job("oom-llama", nil)
	err := j.Run(t.Context(), info, func(ctx context.Context, a *watchdog.Attempt) error {
		err := att(ctx, a)
		ran = append(ran, [2]uint32{a.ResidentBlocks, a.StreamedBlocks})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// The fixture's Llama computes 2 of its 4 layers (FramePack conditions on hidden_states[-3]).
	if ran[0] != [2]uint32{2, 0} {
		t.Fatalf("the first attempt ran %d resident and %d streamed layers; want 2 and 0", ran[0][0], ran[0][1])
	}
	lowered := uint64(float64(laneCap) * 0.85)
	if len(knobs) != 3 || knobs[0] != (watchdog.Knobs{}) || knobs[1] != (watchdog.Knobs{ResidentBlocks: 1}) ||
		knobs[2] != (watchdog.Knobs{ResidentBlocks: 1, MemoryCap: lowered}) {
		t.Fatalf("knobs of the attempts %+v", knobs)
	}
	if len(ran) != 3 || ran[1] != [2]uint32{1, 1} || ran[2] != [2]uint32{1, 1} {
		t.Fatalf("resident and streamed layers of the attempts %v, want [2 0] [1 1] [1 1]", ran)
	}
	story := j.Story()
	if len(story) != 3 || story[0].GetClass() != framepackv1.AttemptClass_ATTEMPT_CLASS_OOM ||
		story[0].GetChange() != "resident llama layers 2 -> 1" || story[1].GetClass() != framepackv1.AttemptClass_ATTEMPT_CLASS_OOM ||
		story[1].GetChange() != fmt.Sprintf("memory cap %d -> %d bytes", laneCap, lowered) {
		t.Fatalf("story %v", story)
	}
	if !equal(readF32(t, out), want) {
		t.Fatal("the retried stage's output differs from the clean run's")
	}
}

// TestFaultConvHang: a convolution hangs at one tier (the fault stays on for every attempt);
// the watchdog names the shape and tier from the beacon, marks them hung in the decision cache,
// and the next worker skips that tier for that shape (its conv statistics say so) and finishes.
func TestFaultConvHang(t *testing.T) {
	base := newRig(t)
	st0, out0 := base.decodeStage(t, 3)
	_, want := opCount(t, base, st0, out0)
	if err := base.cache.Reload(); err != nil { // the worker wrote it
		t.Fatal(err)
	}
	keys := base.cache.Keys()
	if len(keys) == 0 {
		t.Fatal("the clean run recorded no conv shape")
	}
	key := keys[len(keys)/2]
	r := newRig(t, func(c *watchdog.Config) {
		c.FaultPlan = func(watchdog.AttemptInfo) *workerkit.Fault {
			return &workerkit.Fault{HangConvShapeKey: key, HangConvTier: workerkit.ConvTierVendorTuned}
		}
	})
	st, out := r.decodeStage(t, 3)
	var rep lanes.Report
	att := r.attempt(st, &rep)
	var verdict *watchdog.Verdict
	var attempts int
	err := r.wd.Job("convhang", nil).Run(t.Context(), watchdog.StageInfo{Kind: kindOf(st)}, func(ctx context.Context, a *watchdog.Attempt) error {
		attempts = a.Number
		err := att(ctx, a)
		if a.Number == 1 {
			verdict = a.Verdict()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	gotKey, tier, ok := verdict.Conv()
	if attempts != 2 || !ok || gotKey != key || tier != "vendor_tuned" {
		t.Fatalf("attempts %d, verdict %v (conv %q %q)", attempts, verdict, gotKey, tier)
	}
	if late := verdict.At.Sub(verdict.Beacon.OpStart); late > testOp+2*time.Second {
		t.Fatalf("conv hang seen %v after it began", late)
	}
	if err := r.cache.Reload(); err != nil {
		t.Fatal(err)
	}
	if e, _ := r.cache.Lookup(key); !e.IsHung("vendor_tuned") {
		t.Fatalf("decision cache entry %+v", e)
	}
	var skipped uint64
	for _, ts := range rep.Result.Stats.ConvTiers {
		if ts.Tier == workerkit.ConvTierVendorTuned {
			skipped = ts.SkippedAsHung
			if ts.Attempts != 0 {
				t.Fatalf("the retried worker tried the hung tier %d times", ts.Attempts)
			}
		}
	}
	if skipped == 0 {
		t.Fatalf("the retried worker's conv stats show no skipped hung tier: %+v", rep.Result.Stats.ConvTiers)
	}
	t.Logf("%s; retry skipped vendor_tuned for the shape %d times", verdict, skipped)
	if r.wd.Stats().Marked != 1 {
		t.Fatalf("marked %d", r.wd.Stats().Marked)
	}
	if !equal(readF32(t, out), want) {
		t.Fatal("the retried stage's pixels differ from the clean run's")
	}
}

// TestFaultHoldVRAM: a worker exits cleanly but leaves fake device memory held for 3 s after
// it; the recovery check fails, the lane is held (a second stage waits), and the lane is
// released when the memory returns.
func TestFaultHoldVRAM(t *testing.T) {
	const hold = 3 * time.Second
	r := newRig(t, func(c *watchdog.Config) {
		c.FaultPlan = func(a watchdog.AttemptInfo) *workerkit.Fault {
			if a.Stage.Section == 0 { // the first stage only
				return &workerkit.Fault{HoldVRAMBytes: 1 << 30, HoldVRAMSeconds: uint32(hold / time.Second)}
			}
			return nil
		}
		c.Recovery.Timeout = time.Second // the check gives up before the memory returns
		c.HeldPoll = 100 * time.Millisecond
	})
	st, _ := r.decodeStage(t, 4)
	var rep lanes.Report
	j := r.wd.Job("vram", nil)
	if err := j.Run(t.Context(), watchdog.StageInfo{Kind: kindOf(st)}, r.attempt(st, &rep)); err != nil {
		t.Fatal(err)
	}
	exited := time.Now()
	status := r.wd.Health().Status()
	if status.State != watchdog.LaneHeld || !strings.Contains(status.Reason, "not recovered") || status.State.Proto() != framepackv1.LaneState_LANE_STATE_HELD {
		t.Fatalf("lane after the held memory: %+v", status)
	}
	t.Logf("lane %s: %s", status.State, status.Reason)
	st2, _ := r.decodeStage(t, 5)
	var started time.Time
	att := r.attempt(st2, &rep)
	if err := j.Run(t.Context(), watchdog.StageInfo{Kind: kindOf(st2), Section: 1}, func(ctx context.Context, a *watchdog.Attempt) error {
		started = time.Now()
		return att(ctx, a)
	}); err != nil {
		t.Fatal(err)
	}
	if waited := started.Sub(exited); waited < hold-time.Second-100*time.Millisecond {
		t.Fatalf("the next stage started %v after the worker left memory held for %v", waited, hold)
	}
	if s := r.wd.Stats(); s.Holds != 1 || s.Releases != 1 {
		t.Fatalf("holds %d releases %d", s.Holds, s.Releases)
	}
	if u, _ := r.ledger.Used(); u != 0 {
		t.Fatalf("fake vram still used: %d", u)
	}
}

// TestFaultProbeBackoff: after a crash the device probe fails twice (the probe worker cannot
// allocate what it is asked); the lane is degraded and backs off, the job's events say so, and
// the stage runs again once a probe passes.
func TestFaultProbeBackoff(t *testing.T) {
	var probes int
	var degraded []watchdog.LaneStatus
	var r *rig
	r = newRig(t, faultOnce(workerkit.Fault{ExitAtOp: 3}), func(c *watchdog.Config) {
		ok := c.Probe
		bad := watchdog.ProbeWorker(workerkit.Config{Path: workerBins(t)["probe"], Log: c.Log}, "cpu", 0, 1<<62)
		c.Probe = func(ctx context.Context) error {
			probes++
			if probes <= 2 {
				err := bad(ctx)
				return err
			}
			return ok(ctx)
		}
		c.Backoff = watchdog.Backoff{Initial: 100 * time.Millisecond, Max: 150 * time.Millisecond}
	})
	st, _ := r.decodeStage(t, 6)
	var rep lanes.Report
	var evs []watchdog.Retry
	j := r.wd.Job("probe", func(e watchdog.Retry) {
		evs = append(evs, e)
		if r.wd.Health().Status().State == watchdog.LaneDegraded {
			degraded = append(degraded, r.wd.Health().Status())
		}
	})
	if err := j.Run(t.Context(), watchdog.StageInfo{Kind: kindOf(st)}, r.attempt(st, &rep)); err != nil {
		t.Fatal(err)
	}
	if probes != 3 || len(degraded) != 2 || !strings.Contains(degraded[0].Reason, "probe failed") {
		t.Fatalf("probes %d, degraded %+v", probes, degraded)
	}
	var notes []string
	for _, e := range evs {
		if c := e.Attempt.GetChange(); strings.Contains(c, "degraded") {
			notes = append(notes, c)
		}
	}
	if len(notes) != 2 || evs[len(evs)-1].Delay != 150*time.Millisecond {
		t.Fatalf("job events %v", evs)
	}
	t.Logf("job event: %s", notes[0])
	if st := r.wd.Health().Status(); st.State != watchdog.LaneHealthy || st.Degrades != 1 {
		t.Fatalf("lane %+v", st)
	}
}

// TestFaultBadInputNeverRetried: latents of the wrong channel count fail as bad input once.
func TestFaultBadInputNeverRetried(t *testing.T) {
	r := newRig(t)
	st, _ := r.decodeStage(t, 7)
	req := *st.Request.(*workerkit.VAEDecodeRequest)
	req.Latents.Name = "missing"
	st.Request = &req
	var rep lanes.Report
	n := 0
	att := r.attempt(st, &rep)
	err := r.wd.Job("bad", nil).Run(t.Context(), watchdog.StageInfo{Kind: kindOf(st)}, func(ctx context.Context, a *watchdog.Attempt) error {
		n++
		return att(ctx, a)
	})
	var ge *watchdog.GiveUpError
	if !errors.As(err, &ge) || ge.Class != watchdog.ClassBadInput || n != 1 || len(ge.Attempts) != 1 {
		t.Fatalf("err %v after %d attempts", err, n)
	}
	t.Log(err)
}

// TestFaultBudgetExhausted: a stage that runs out of memory on every attempt ends the job with
// the whole story; the lane stays healthy and the next stage runs.
func TestFaultBudgetExhausted(t *testing.T) {
	r := newRig(t, func(c *watchdog.Config) {
		c.Budget = watchdog.Budget{PerStage: 3, PerJob: 10}
		c.FaultPlan = func(a watchdog.AttemptInfo) *workerkit.Fault {
			if a.JobID == "doomed" {
				return &workerkit.Fault{OOMAtOp: 2}
			}
			return nil
		}
	})
	st, _ := r.decodeStage(t, 8)
	var rep lanes.Report
	err := r.wd.Job("doomed", nil).Run(t.Context(), watchdog.StageInfo{Kind: kindOf(st), Section: 1}, r.attempt(st, &rep))
	var ge *watchdog.GiveUpError
	if !errors.As(err, &ge) {
		t.Fatalf("err %v", err)
	}
	f := ge.Failure()
	var classes, changes []string
	for _, a := range f.GetAttempts() {
		classes = append(classes, a.GetClass().String())
		changes = append(changes, a.GetChange())
	}
	if len(classes) != 3 || slices.ContainsFunc(classes, func(c string) bool { return c != "ATTEMPT_CLASS_OOM" }) ||
		changes[0] != "vae tile untiled -> 256 px" || changes[2] != "" || f.GetSectionIndex() != 1 {
		t.Fatalf("failure %v", f)
	}
	t.Logf("%s", f.GetMessage())
	st2, out2 := r.decodeStage(t, 8)
	if err := r.wd.Job("next", nil).Run(t.Context(), watchdog.StageInfo{Kind: kindOf(st2)}, r.attempt(st2, &rep)); err != nil {
		t.Fatalf("the next job's stage: %v", err)
	}
	if len(readF32(t, out2)) == 0 {
		t.Fatal("no output")
	}
}
