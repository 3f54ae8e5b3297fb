package watchdog_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/watchdog"
)

var (
	soakJobs  = flag.Int("soak.jobs", 8, "TestFaultSoak: number of demo jobs (8 in make test; make soak runs 50)")
	soakRate  = flag.Float64("soak.rate", 0.3, "TestFaultSoak: share of stage attempts that get a fault")
	soakSeed  = flag.Uint64("soak.seed", 1, "TestFaultSoak: seed of the fault plan")
	soakSeeds = flag.Int("soak.variants", 2, "TestFaultSoak: distinct job seeds (one reference run each)")
)

// faultKind is what the soak injects into one attempt.
type faultKind int

const (
	faultExit faultKind = iota
	faultHang
	faultOOM
	faultConvHang
	faultHoldVRAM
	numFaultKinds
)

var faultNames = [numFaultKinds]string{"exit (signal)", "hang at op", "oom at op", "conv hang", "hold vram"}

// soakPlan draws a random fault for ~rate of all stage attempts.
type soakPlan struct {
	rate float64

	mu        sync.Mutex // mu protects the fields below
	rng       *rand.Rand
	injected  [numFaultKinds]int
	longHolds int // hold_vram faults that outlast the recovery check
	faults    map[attemptKey]injection
	doom      bool // every attempt runs out of memory (the budget test at the end)
}

// attemptKey names one stage attempt of one job.
type attemptKey struct {
	job     string
	stage   framepackv1.Stage
	section uint32
	attempt uint32
}

// injection is one fault the plan gave an attempt.
type injection struct {
	kind  faultKind
	fault workerkit.Fault
}

// holdShort recovers within the recovery check; holdLong outlasts it (the lane is held).
const (
	soakRecovery = 2 * time.Second
	holdShort    = 1
	holdLong     = 3
)

var exitSignals = []syscall.Signal{syscall.SIGKILL, syscall.SIGSEGV, syscall.SIGABRT, syscall.SIGTERM}

func (p *soakPlan) plan(a watchdog.AttemptInfo) *workerkit.Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.doom {
		return &workerkit.Fault{OOMAtOp: 1}
	}
	if p.rng.Float64() >= p.rate {
		return nil
	}
	kinds := []faultKind{faultHoldVRAM}
	if a.OpsSeen > 0 {
		kinds = append(kinds, faultExit, faultHang, faultOOM)
	}
	switch a.Stage.Kind {
	case framepackv1.Stage_STAGE_VAE_ENCODE, framepackv1.Stage_STAGE_VAE_DECODE, framepackv1.Stage_STAGE_IMAGE_ENCODE:
		kinds = append(kinds, faultConvHang)
	}
	k := kinds[p.rng.IntN(len(kinds))]
	p.injected[k]++
	op := 1 + p.rng.Uint64N(max(a.OpsSeen, 1))
	var f workerkit.Fault
	switch k {
	case faultExit:
		f = workerkit.Fault{ExitAtOp: op, ExitSignal: int32(exitSignals[p.rng.IntN(len(exitSignals))])}
	case faultHang:
		f = workerkit.Fault{HangAtOp: op}
	case faultOOM:
		f = workerkit.Fault{OOMAtOp: op}
	case faultConvHang:
		tiers := []workerkit.ConvTier{workerkit.ConvTierVendorTuned, workerkit.ConvTierVendorDefault, workerkit.ConvTierOwnKernel}
		f = workerkit.Fault{HangConvTier: tiers[p.rng.IntN(len(tiers))]} // the first shape not yet marked hung there
	default:
		secs := uint32(holdShort)
		if p.rng.IntN(2) == 0 {
			secs = holdLong
			p.longHolds++
		}
		f = workerkit.Fault{HoldVRAMBytes: 512 << 20, HoldVRAMSeconds: secs}
	}
	p.faults[attemptKey{a.JobID, a.Stage.Kind, a.Stage.Section, uint32(a.Attempt)}] = injection{kind: k, fault: f}
	return &f
}

// expected is the class an attempt with this fault must end with (-1: it succeeds).
func (k faultKind) expected() watchdog.Class {
	switch k {
	case faultExit:
		return watchdog.ClassCrash
	case faultHang, faultConvHang:
		return watchdog.ClassHang
	case faultOOM:
		return watchdog.ClassOOM
	}
	return -1
}

// classOf maps an attempt's API class back to the watchdog's.
func classOf(c framepackv1.AttemptClass) watchdog.Class {
	for _, k := range watchdog.Classes() {
		if k.Proto() == c {
			return k
		}
	}
	return -1
}

// TestFaultSoak runs -soak.jobs demo jobs (8 in `make test`, 50 in `make soak`) (tiny models, 32×32 frames, 3 steps, two sections)
// through the daemon with a random fault in ~30 % of stage attempts: every job must finish
// with the frames of the same job run without faults, no worker process, shared memory or
// file descriptor may be left, and the lane must be seen held in ListDevices when a worker
// leaves memory held. It prints what was injected, detected, retried and recovered.
func TestFaultSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: not in -short")
	}
	start := time.Now()
	img := demoImage(t)
	variants := max(*soakSeeds, 1)

	// References: each job variant once, without faults.
	ref := newDaemonOpts(t)
	rd, err := startDaemon(ref, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	rc := conn(t, ref.Socket)
	want := map[int64][]float32{}
	for v := range variants {
		seed := int64(100 + v)
		id := submit(t, framepackv1.NewJobServiceClient(rc), demoSpec(seed), img)
		if ev := waitJob(t, framepackv1.NewJobServiceClient(rc), id); ev.GetJobFinished() == nil {
			t.Fatalf("reference job (seed %d): %v", seed, ev)
		}
		want[seed] = finalPixels(t, ref.State, id, 2)
	}
	rc.Close()
	if err := rd.stop(); err != nil {
		t.Fatal(err)
	}
	refTime := time.Since(start)

	fdsBefore := openFDs()
	p := &soakPlan{rate: *soakRate, rng: rand.New(rand.NewPCG(*soakSeed, 2)), faults: map[attemptKey]injection{}}
	o := newDaemonOpts(t)
	o.OpDeadline = 2 * time.Second
	o.plan = p.plan
	o.config = func(c *watchdog.Config) {
		c.Recovery.Timeout = soakRecovery
		c.HeldPoll = 100 * time.Millisecond
		c.Backoff = watchdog.Backoff{Initial: 200 * time.Millisecond, Max: time.Second}
	}
	d, err := startDaemon(o, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	c := conn(t, o.Socket)
	jc := framepackv1.NewJobServiceClient(c)

	// ListDevices, polled while the jobs run: the lane must show as held when it is.
	pollCtx, stopPoll := context.WithCancel(t.Context())
	var seenMu sync.Mutex
	seen := map[framepackv1.LaneState]int{}
	var heldReason string
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		dc := framepackv1.NewDeviceServiceClient(c)
		for pollCtx.Err() == nil {
			if resp, err := dc.ListDevices(pollCtx, &framepackv1.ListDevicesRequest{}); err == nil {
				for _, dev := range resp.GetDevices() {
					seenMu.Lock()
					seen[dev.GetLaneState()]++
					if dev.GetLaneState() == framepackv1.LaneState_LANE_STATE_HELD && heldReason == "" {
						heldReason = dev.GetLaneStateReason()
					}
					seenMu.Unlock()
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()

	soakStart := time.Now()
	type job struct {
		id   string
		seed int64
	}
	var js []job
	for i := range *soakJobs {
		seed := int64(100 + i%variants)
		js = append(js, job{id: submit(t, jc, demoSpec(seed), img), seed: seed})
	}
	retries, differ := 0, 0
	var failed []string
	failedAttempts := map[attemptKey]*framepackv1.Attempt{} // from the jobs' Retry events
	for i, j := range js {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
		last, err := watch(ctx, jc, j.id, func(ev *framepackv1.JobEvent) bool {
			if r := ev.GetRetry(); r != nil {
				retries++
				a := r.GetAttempt()
				k := attemptKey{ev.GetJobId(), a.GetStage(), a.GetSectionIndex(), a.GetAttempt()}
				if _, ok := failedAttempts[k]; !ok { // later events of one attempt: lane notes
					failedAttempts[k] = a
				}
			}
			return true
		})
		cancel()
		if err != nil {
			t.Fatalf("watch job %d: %v", i, err)
		}
		if last.GetJobFinished() == nil {
			failed = append(failed, fmt.Sprintf("job %d %s: %v", i, j.id, last))
			continue
		}
		if !equal(finalPixels(t, o.State, j.id, 2), want[j.seed]) {
			differ++
			t.Errorf("job %d (%s, seed %d): frames differ from the run without faults", i, j.id, j.seed)
		}
	}
	soakTime := time.Since(soakStart)
	stats := d.wd.Stats()

	// A job whose stage fails on every attempt fails with the whole story; the service stays
	// up and the next job runs.
	p.mu.Lock()
	p.doom = true
	p.mu.Unlock()
	doomed := submit(t, jc, demoSpec(100), img)
	ev := waitJob(t, jc, doomed)
	p.mu.Lock()
	p.doom = false
	rate := p.rate
	p.rate = 0 // the job after it runs clean: its events are not tallied
	p.mu.Unlock()
	story := ev.GetJobFailed().GetFailure()
	if story == nil || len(story.GetAttempts()) != watchdog.DefaultBudget.PerStage ||
		story.GetAttempts()[0].GetClass() != framepackv1.AttemptClass_ATTEMPT_CLASS_OOM || story.GetAttempts()[0].GetChange() == "" {
		t.Fatalf("doomed job: %v", ev)
	}
	t.Logf("doomed job failed: %s (%d attempts, first change %q)", story.GetMessage(), len(story.GetAttempts()), story.GetAttempts()[0].GetChange())
	after := submit(t, jc, demoSpec(101), img)
	if ev := waitJob(t, jc, after); ev.GetJobFinished() == nil {
		t.Fatalf("the job after the failed one: %v", ev)
	}
	if !equal(finalPixels(t, o.State, after, 2), want[101]) && variants > 1 {
		t.Error("the job after the failed one has other frames")
	}
	stopPoll()
	<-polled
	c.Close()
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}

	// What was injected, and what the watchdog made of each fault, attempt by attempt: the
	// class of the failed attempt (its Retry event) must be the fault's.
	var det, moot [numFaultKinds]int
	var misses []string
	for k, in := range p.faults {
		a, failedHere := failedAttempts[k]
		switch want := in.kind.expected(); {
		case want < 0: // hold vram: the stage itself succeeds
		case failedHere && classOf(a.GetClass()) == want:
			det[in.kind]++
		case !failedHere && in.kind == faultConvHang:
			moot[in.kind]++ // every shape of the stage was marked hung at that tier already: skipped
		default:
			misses = append(misses, fmt.Sprintf("%s %+v on %v: %v", faultNames[in.kind], in.fault, k, a))
		}
	}
	spurious := 0
	for k, a := range failedAttempts {
		if _, ok := p.faults[k]; !ok {
			spurious++
			t.Logf("failure without an injected fault (a loaded machine?): %v %v", k, a)
		}
	}
	cl := stats.Classes
	var b strings.Builder
	fmt.Fprintf(&b, "soak: %d jobs, %d finished, %d failed, %d with other frames; %d stage attempts failed (%d without an injected fault), %d retry events; fault rate %.2f, seed %d\n",
		len(js), len(js)-len(failed), len(failed), differ, len(failedAttempts), spurious, retries, rate, *soakSeed)
	fmt.Fprintf(&b, "  %-16s %9s %9s %8s %10s %s\n", "fault", "injected", "detected", "retried", "recovered", "(watchdog class counts)")
	row := func(name string, inj, d int, c watchdog.Class, extra string) {
		n := cl[c]
		fmt.Fprintf(&b, "  %-16s %9d %9d %8d %10d %s\n", name, inj, d, n.Retried, n.Recovered, extra)
	}
	row(faultNames[faultExit], p.injected[faultExit], det[faultExit], watchdog.ClassCrash, "crash")
	row(faultNames[faultOOM], p.injected[faultOOM], det[faultOOM], watchdog.ClassOOM, "oom")
	row(faultNames[faultHang], p.injected[faultHang], det[faultHang], watchdog.ClassHang, "hang (both kinds)")
	fmt.Fprintf(&b, "  %-16s %9d %9d %8d %10d %s\n", faultNames[faultConvHang], p.injected[faultConvHang], det[faultConvHang],
		stats.Marked, stats.Marked, fmt.Sprintf("marked in the decision cache; %d moot (tier already skipped for every shape)", moot[faultConvHang]))
	fmt.Fprintf(&b, "  %-16s %9d %9d %8d %10d %s\n", faultNames[faultHoldVRAM], p.injected[faultHoldVRAM], stats.Holds, 0, stats.Releases,
		fmt.Sprintf("%d outlast the %v check: lane held, released when the memory came back", p.longHolds, soakRecovery))
	fmt.Fprintf(&b, "  device probes %d (%d failed); lane states seen in ListDevices %v\n", stats.Probes, stats.ProbeFailures, seen)
	fmt.Fprintf(&b, "  time: references %v, soak %v (%.1f s a job)", refTime.Round(time.Second), soakTime.Round(time.Second),
		soakTime.Seconds()/float64(len(js)))
	t.Log("\n" + b.String())
	fmt.Fprintln(os.Stderr, b.String())

	if len(failed) > 0 {
		t.Fatalf("jobs did not finish: %v", failed)
	}
	if len(misses) > 0 {
		t.Errorf("faults not seen as their class: %v", misses)
	}
	if stats.Marked != det[faultConvHang] {
		t.Errorf("conv hangs detected %d, marked %d", det[faultConvHang], stats.Marked)
	}
	if stats.Holds != p.longHolds || stats.Releases != stats.Holds {
		t.Errorf("long vram holds %d, lane held %d times, released %d", p.longHolds, stats.Holds, stats.Releases)
	}
	if stats.Holds > 0 && seen[framepackv1.LaneState_LANE_STATE_HELD] == 0 {
		t.Error("ListDevices never showed the held lane")
	} else if heldReason != "" {
		t.Logf("ListDevices while held: %s", heldReason)
	}
	for _, k := range watchdog.Classes() {
		if n := cl[k]; n.Recovered != n.Retried || n.GaveUp != 0 {
			t.Errorf("class %s: %+v", k, n)
		}
	}

	// Nothing left behind.
	if left := workertest.Processes(o.Workers); len(left) > 0 {
		t.Errorf("worker processes left: %v", left)
	}
	if kids := children(os.Getpid()); len(kids) > 0 {
		t.Errorf("child processes left: %v", kids)
	}
	if err := shmEmpty(o.Shm); err != nil {
		t.Error(err)
	}
	fdsAfter := openFDs()
	var leaked []string
	for fd, target := range fdsAfter {
		if _, ok := fdsBefore[fd]; !ok {
			leaked = append(leaked, fd+" -> "+target)
		}
	}
	slices.Sort(leaked)
	if len(leaked) > 0 {
		t.Errorf("file descriptors opened by the soak and still open (%d before, %d after): %v", len(fdsBefore), len(fdsAfter), leaked)
	} else {
		t.Logf("file descriptors: %d before, %d after", len(fdsBefore), len(fdsAfter))
	}
}
