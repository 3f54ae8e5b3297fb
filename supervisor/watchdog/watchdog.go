package watchdog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/framepackd/framepackd/internal/convcache"
	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// Defaults of Config.
const (
	DefaultProbeTimeout = 30 * time.Second
	DefaultHeldPoll     = time.Second
)

// Budget bounds retries: attempts of one stage (the first included) and failed attempts of
// one job over all its stages.
type Budget struct {
	PerStage int
	PerJob   int
}

// DefaultBudget is 5 attempts per stage, 16 failed attempts per job.
var DefaultBudget = Budget{PerStage: 5, PerJob: 16}

// Config configures the watchdog of one lane.
type Config struct {
	// Lane is the lane's name ("cpu", "cuda:0"); required.
	Lane string
	// LaneBackend is the lane's backend ("cpu", "cuda", "hip"): a lane that is already on
	// the CPU has no CPU rung.
	LaneBackend string
	// Deadlines set the stage limits; a zero value means DefaultDeadlines.
	Deadlines Deadlines
	// Recovery is the check after every worker exit; nil checks only that the worker's
	// process group is gone, with the default timing.
	Recovery *Recovery
	// HeldPoll is how often a held lane reads the device memory again; 0 means
	// DefaultHeldPoll.
	HeldPoll time.Duration
	// Probe checks the device after a crash or a lost device; nil skips the probe.
	Probe Prober
	// ProbeTimeout bounds one probe; 0 means DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// Backoff spaces the probes of a degraded lane; zero means DefaultBackoff.
	Backoff Backoff
	// Ladder is the degradation ladder; a zero value means DefaultLadder(0).
	Ladder Ladder
	// Budget bounds retries; zero fields take DefaultBudget's.
	Budget Budget
	// ConvCache is the shared conv decision cache where hung shapes are marked; every
	// worker's LoadRequest names it (Attempt.ApplyLoad). Nil: hangs are not marked.
	ConvCache *convcache.Cache
	// FaultPlan returns the fault to inject into an attempt. Tests only: nothing outside a
	// test sets it (see package faults).
	FaultPlan func(AttemptInfo) *workerkit.Fault
	// Log is the watchdog's logger; nil means the standard logger.
	Log *logrus.Entry
}

// StageInfo describes one stage of a job to the watchdog.
type StageInfo struct {
	// Kind is the stage.
	Kind framepackv1.Stage
	// Model names the worker, for logs.
	Model string
	// Section is the section index of a per-section stage.
	Section uint32
	// Size sets the stage's deadline.
	Size Size
	// Small allows the CPU rung of the ladder.
	Small bool
	// Traits is what the stage's model has that a retry can change, as a worker of it declared
	// it (LoadResponse); the zero value: not known yet. The watchdog fills it in from an
	// earlier Load of the model on the lane and from each attempt's (Attempt.Traits); before
	// any Load of the model succeeded only the model-free rungs (cap, cpu) apply.
	Traits workerkit.ModelTraits
	// Knobs are the first attempt's settings.
	Knobs workerkit.Override
	// MemoryCap is the cap the stage's worker runs under (the lane's cap for the job), which
	// the ladder lowers; 0 means Ladder.LaneCap.
	MemoryCap uint64
	// LaneBackend is filled in by the watchdog from its Config.
	LaneBackend string
}

// Name is the stage's name for messages ("vae_decode", "transformer section 2").
func (s StageInfo) Name() string {
	n := strings.TrimPrefix(strings.ToLower(s.Kind.String()), "stage_")
	if s.Kind == framepackv1.Stage_STAGE_TRANSFORMER || s.Kind == framepackv1.Stage_STAGE_VAE_DECODE {
		n += fmt.Sprintf(" section %d", s.Section)
	}
	return n
}

// AttemptInfo identifies one attempt, for a FaultPlan.
type AttemptInfo struct {
	JobID   string
	Stage   StageInfo
	Attempt int
	Knobs   workerkit.Override
	// OpsSeen is the fewest ops a successful attempt of this stage kind ran on the lane so far
	// (0: none yet), so a plan can aim an op-numbered fault inside the stage.
	OpsSeen uint64
}

// Counts are what the watchdog did about one class of failure.
type Counts struct {
	// Detected counts attempts classified so.
	Detected int
	// Retried counts those that were tried again.
	Retried int
	// Recovered counts those whose stage later succeeded.
	Recovered int
	// GaveUp counts those after which the job failed.
	GaveUp int
}

// Stats are a watchdog's counters since it started.
type Stats struct {
	Classes map[Class]Counts
	// Probes and ProbeFailures count device probes.
	Probes, ProbeFailures int
	// Holds counts recovery checks that failed (the lane was held); Releases the holds that
	// ended when the memory came back.
	Holds, Releases int
	// Marked counts conv shapes marked hung in the decision cache.
	Marked int
}

// Watchdog guards the stages of one lane: it watches every attempt, classifies how it ended,
// checks that device memory came back, probes the device after crashes, keeps the lane's
// health and retries down the degradation ladder within the retry budget.
type Watchdog struct {
	cfg    Config
	log    *logrus.Entry
	health *Health
	rec    *Recovery

	ctx    context.Context // ends monitors at Close
	cancel context.CancelFunc

	// mu protects stats, monitoring, opsSeen and traits.
	mu         sync.Mutex
	stats      Stats
	monitoring bool
	opsSeen    map[framepackv1.Stage]uint64
	traits     map[string]workerkit.ModelTraits // by StageInfo.Model: the last a worker declared
}

// New returns the watchdog of one lane.
func New(cfg Config) (*Watchdog, error) {
	if cfg.Lane == "" {
		return nil, errors.New("new watchdog: Lane is required")
	}
	if cfg.Deadlines.Stages == nil && cfg.Deadlines.Default == (Cost{}) {
		cfg.Deadlines = DefaultDeadlines()
	}
	if cfg.Ladder.VAETiles == nil && cfg.Ladder.CapSteps == 0 && !cfg.Ladder.ConvTierDown && !cfg.Ladder.CPUFallback && !cfg.Ladder.FewerResidentBlocks {
		cfg.Ladder = DefaultLadder(0)
	}
	if cfg.Budget.PerStage <= 0 {
		cfg.Budget.PerStage = DefaultBudget.PerStage
	}
	if cfg.Budget.PerJob <= 0 {
		cfg.Budget.PerJob = DefaultBudget.PerJob
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = DefaultProbeTimeout
	}
	if cfg.HeldPoll <= 0 {
		cfg.HeldPoll = DefaultHeldPoll
	}
	rec := cfg.Recovery
	if rec == nil {
		rec = &Recovery{}
	}
	log := cfg.Log
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Watchdog{cfg: cfg, log: log.WithField("lane", cfg.Lane), health: NewHealth(cfg.Lane), rec: rec,
		ctx: ctx, cancel: cancel, stats: Stats{Classes: map[Class]Counts{}}, opsSeen: map[framepackv1.Stage]uint64{},
		traits: map[string]workerkit.ModelTraits{}}, nil
}

// Close stops the watchdog's background monitors.
func (w *Watchdog) Close() { w.cancel() }

// Health returns the lane's health (for ListDevices and the lane's scheduler).
func (w *Watchdog) Health() *Health { return w.health }

// Stats returns a copy of the counters.
func (w *Watchdog) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.stats
	s.Classes = make(map[Class]Counts, len(w.stats.Classes))
	for k, v := range w.stats.Classes {
		s.Classes[k] = v
	}
	return s
}

func (w *Watchdog) count(f func(s *Stats)) {
	w.mu.Lock()
	f(&w.stats)
	w.mu.Unlock()
}

func (w *Watchdog) countClass(c Class, f func(n *Counts)) {
	w.count(func(s *Stats) {
		n := s.Classes[c]
		f(&n)
		s.Classes[c] = n
	})
}

// Limits returns the limits of an attempt of st.
func (w *Watchdog) Limits(st StageInfo) Limits { return w.cfg.Deadlines.Limits(st.Kind, st.Size) }

// RecoverDevice probes the lane's device until a probe passes or ctx ends. While probes fail
// the lane is degraded and the wait between probes backs off (Config.Backoff); notify, if not
// nil, hears of every failed probe and the wait that follows. Without a prober the device is
// taken as healthy.
func (w *Watchdog) RecoverDevice(ctx context.Context, notify func(reason string, wait time.Duration)) error {
	if w.cfg.Probe == nil {
		return nil
	}
	var wait time.Duration
	for {
		pctx, cancel := context.WithTimeout(ctx, w.cfg.ProbeTimeout)
		t0 := time.Now()
		err := w.cfg.Probe(pctx)
		cancel()
		w.count(func(s *Stats) { s.Probes++ })
		if err == nil {
			if w.health.Status().State == LaneDegraded {
				w.log.Info("watchdog: device probe passed; lane healthy again")
				w.health.MarkHealthy()
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("recover device of lane %s: %w", w.cfg.Lane, context.Cause(ctx))
		}
		w.count(func(s *Stats) { s.ProbeFailures++ })
		wait = w.cfg.Backoff.next(wait)
		reason := fmt.Sprintf("device probe failed (%v, took %v)", err, time.Since(t0).Round(time.Millisecond))
		w.health.Degrade(reason, time.Now().Add(wait))
		w.log.WithError(err).WithField("wait", wait).Warn("watchdog: device probe failed; lane degraded")
		if notify != nil {
			notify(reason, wait)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("recover device of lane %s: %w", w.cfg.Lane, context.Cause(ctx))
		case <-time.After(wait):
		}
	}
}

// hold marks the lane held and starts the monitor that releases it when the device memory is
// back at baseline.
func (w *Watchdog) hold(res RecoveryResult) {
	w.count(func(s *Stats) { s.Holds++ })
	reason := res.String()
	w.log.WithField("reason", reason).Error("watchdog: device memory did not come back after the worker exited; lane held")
	w.health.Hold(reason)
	w.mu.Lock()
	start := !w.monitoring
	w.monitoring = true
	w.mu.Unlock()
	if start {
		go w.monitorHeld(res.Baseline)
	}
}

// monitorHeld re-checks the device memory of a held lane until it is back, then releases the
// lane (unless an operator released it first).
func (w *Watchdog) monitorHeld(baseline uint64) {
	defer func() {
		w.mu.Lock()
		w.monitoring = false
		w.mu.Unlock()
	}()
	quick := *w.rec
	quick.Timeout = w.cfg.HeldPoll
	for {
		if w.health.Status().State != LaneHeld {
			return
		}
		res := quick.Check(w.ctx, baseline, 0)
		if w.ctx.Err() != nil {
			return
		}
		if res.Recovered {
			if w.health.Status().State == LaneHeld {
				w.count(func(s *Stats) { s.Releases++ })
				w.log.WithField("used", res.Used).Info("watchdog: device memory came back; lane released")
				w.health.MarkHealthy()
			}
			return
		}
		select {
		case <-w.ctx.Done():
			return
		case <-w.health.Changed():
		case <-time.After(w.cfg.HeldPoll):
		}
	}
}

// MarkHung records "shape key hung at tier" in the decision cache.
func (w *Watchdog) MarkHung(m ConvMark) error {
	if w.cfg.ConvCache == nil {
		return errors.New("mark hung conv: no decision cache configured")
	}
	if err := w.cfg.ConvCache.MarkHung(m.Key, m.Tier); err != nil {
		return fmt.Errorf("mark hung conv: %w", err)
	}
	w.count(func(s *Stats) { s.Marked++ })
	return nil
}

// Attempt is one try of a stage, handed to the AttemptFunc that runs it on the lane.
type Attempt struct {
	JobID  string
	Stage  StageInfo
	Number int
	// Knobs are the ladder's settings for this attempt (Override adds the rest).
	Knobs  workerkit.Override
	Limits Limits
	// Fault is the test fault to inject through LoadRequest.Fault (nil in production).
	Fault *workerkit.Fault
	// Kept is set by the AttemptFunc when the stage succeeded and its worker stays resident
	// (the recovery check is then skipped).
	Kept bool
	// ResidentBlocks and StreamedBlocks are set by the AttemptFunc from the LoadResponse of a
	// worker whose model has a stack of blocks (transformer blocks, Llama layers): the
	// residency the attempt actually ran with, which the ladder's resident-block rung lowers
	// from after an out-of-memory error.
	ResidentBlocks, StreamedBlocks uint32
	// Traits is set by the AttemptFunc from the worker's LoadResponse (nil: it did not load):
	// what the model has that the next attempt can change.
	Traits *workerkit.ModelTraits

	w     *Watchdog
	guard *Guard

	mu    sync.Mutex // mu protects pgids
	pgids []int
}

// Attach is the lane's hook: it watches p, a worker process of this attempt, from the moment
// it exists; the returned stop must be called before a deliberate teardown.
func (a *Attempt) Attach(p Target) (stop func()) {
	a.mu.Lock()
	a.pgids = append(a.pgids, p.PID())
	a.mu.Unlock()
	return a.guard.Attach(p)
}

// Verdict returns what the watchdog saw during the attempt so far (nil: nothing wrong).
func (a *Attempt) Verdict() *Verdict { return a.guard.Verdict() }

// Override returns what the attempt runs with instead of the lane's and the model's defaults:
// the ladder's settings, the conv decision cache the watchdog marks hung shapes in, and the test
// fault. The pipeline hands it to the lane, which applies it to the worker's LoadRequest and
// the stage's request (workerkit.Override); the watchdog edits no worker request itself.
func (a *Attempt) Override() workerkit.Override {
	o := a.Knobs
	if a.w.cfg.ConvCache != nil {
		o.ConvCachePath = a.w.cfg.ConvCache.Path()
	}
	if a.Fault != nil {
		f := *a.Fault
		o.Fault = &f
	}
	return o
}

// AttemptFunc runs one attempt of a stage on the lane: spawn the worker (attaching it with
// a.Attach as soon as it exists), load and run it as a.Override says, tear the worker down.
// It returns the stage's error, nil on success.
type AttemptFunc func(ctx context.Context, a *Attempt) error

// Job keeps one job's retry budget and the story of its attempts. A Job serves one job; its
// stages run one after another.
type Job struct {
	w       *Watchdog
	id      string
	onRetry func(Retry)

	failed int
	story  []*framepackv1.Attempt
}

// Retry is one retry of a stage as the watchdog reports it: the failed attempt (with what the
// next one changes) and the wait before the next. The pipeline turns it into the job's public
// Retry event.
type Retry struct {
	// Attempt is the failed attempt's record (its Change says what the next one changes).
	Attempt *framepackv1.Attempt
	// Delay is the wait before the next attempt (a degraded lane's next probe), 0 for none.
	Delay time.Duration
}

// Job returns the retry state of job id; onRetry (may be nil) hears of every retry.
func (w *Watchdog) Job(id string, onRetry func(Retry)) *Job {
	return &Job{w: w, id: id, onRetry: onRetry}
}

// Story returns every attempt of every stage that did not succeed at first try, oldest first.
func (j *Job) Story() []*framepackv1.Attempt {
	out := make([]*framepackv1.Attempt, len(j.story))
	for i, a := range j.story {
		out[i] = proto.Clone(a).(*framepackv1.Attempt)
	}
	return out
}

func (j *Job) retryEvent(rec *framepackv1.Attempt, delay time.Duration) {
	if j.onRetry == nil {
		return
	}
	j.onRetry(Retry{Attempt: proto.Clone(rec).(*framepackv1.Attempt), Delay: delay})
}

// Run runs stage st through fn until an attempt succeeds, and returns nil; or returns the
// job's failure as a *GiveUpError (bad input, budget or ladder exhausted), or ctx's error.
// Before every attempt it waits for the lane to be healthy; after every attempt it checks that
// the device memory came back; after a crash or a lost device it probes the device, backing
// off while the probe fails.
func (j *Job) Run(ctx context.Context, st StageInfo, fn AttemptFunc) error {
	w := j.w
	st.LaneBackend = w.cfg.LaneBackend
	st.Traits = w.knownTraits(st)
	knobs := st.Knobs
	log := w.log.WithFields(logrus.Fields{"job": j.id, "stage": st.Name()})
	var pending []Class // failed attempts of this stage, for Recovered
	for n := 1; ; n++ {
		if err := w.health.Wait(ctx); err != nil {
			return err
		}
		a := &Attempt{JobID: j.id, Stage: st, Number: n, Knobs: knobs, Limits: w.Limits(st), w: w}
		a.guard = NewGuard(a.Limits, log.WithField("attempt", n))
		if w.cfg.FaultPlan != nil {
			w.mu.Lock()
			seen := w.opsSeen[st.Kind]
			w.mu.Unlock()
			a.Fault = w.cfg.FaultPlan(AttemptInfo{JobID: j.id, Stage: st, Attempt: n, Knobs: knobs, OpsSeen: seen})
		}
		baseline, berr := w.rec.Baseline(ctx)
		if berr != nil {
			log.WithError(berr).Warn("watchdog: no memory baseline before the attempt")
		}
		start := time.Now()
		err := fn(ctx, a)
		a.guard.Stop()
		dur := time.Since(start)
		v := a.guard.Verdict()
		class, why := Classify(ctx, err, v)
		if a.Traits == nil { // a Load that ran out of memory declares them in its error
			a.Traits = workerkit.TraitsOf(err)
		}
		if a.Traits != nil { // what the worker declared at Load: the next attempts' rungs
			st.Traits = *a.Traits
			w.mu.Lock()
			w.traits[st.Model] = *a.Traits
			w.mu.Unlock()
		}

		if !a.Kept {
			w.checkRecovery(ctx, a, baseline, berr == nil)
		}

		rec := &framepackv1.Attempt{Stage: st.Kind, SectionIndex: st.Section, Attempt: uint32(n), Class: class.Proto(),
			Lane: w.cfg.Lane, StartTime: timestamppb.New(start), Duration: durationpb.New(dur)}
		switch class {
		case ClassOK:
			if ops := a.guard.Ops(); ops > 0 {
				w.mu.Lock()
				if o := w.opsSeen[st.Kind]; o == 0 || ops < o {
					w.opsSeen[st.Kind] = ops
				}
				w.mu.Unlock()
			}
			if n > 1 {
				j.story = append(j.story, rec)
				for _, c := range pending {
					w.countClass(c, func(n *Counts) { n.Recovered++ })
				}
				log.WithFields(logrus.Fields{"attempt": n, "knobs": knobs.String()}).Info("watchdog: stage recovered")
			}
			return nil
		case ClassCancelled:
			return err
		}
		rec.Message = why
		j.story = append(j.story, rec)
		j.failed++
		w.countClass(class, func(n *Counts) { n.Detected++ })
		log = log.WithField("class", class.String())
		log.WithFields(logrus.Fields{"attempt": n, "knobs": knobs.String()}).WithError(err).Warn("watchdog: stage attempt failed")

		giveUp := func(reason string) error {
			w.countClass(class, func(n *Counts) { n.GaveUp++ })
			return &GiveUpError{Stage: st, Class: class, Reason: reason, Tries: n, Attempts: j.Story(), Err: err}
		}
		if !class.Retryable() {
			return giveUp(class.String() + " is never retried")
		}
		if n >= w.cfg.Budget.PerStage {
			return giveUp(fmt.Sprintf("stage retry budget exhausted (%d attempts)", n))
		}
		if j.failed >= w.cfg.Budget.PerJob {
			return giveUp(fmt.Sprintf("job retry budget exhausted (%d failed attempts)", j.failed))
		}
		if class == ClassOOM {
			knobs = ranWith(st, knobs, a.ResidentBlocks, a.StreamedBlocks)
		}
		step, ok := w.cfg.Ladder.Next(st, class, n, knobs, v)
		if !ok {
			return giveUp("the degradation ladder has nothing left to try")
		}
		if step.MarkHung != nil {
			if merr := w.MarkHung(*step.MarkHung); merr != nil {
				log.WithError(merr).Error("watchdog: mark hung conv")
				step.Change += " (not recorded: " + merr.Error() + ")"
			}
		}
		rec.Change = step.Change
		w.countClass(class, func(n *Counts) { n.Retried++ })
		pending = append(pending, class)
		j.retryEvent(rec, 0)
		if class.NeedsProbe() {
			notify := func(reason string, wait time.Duration) {
				r := proto.Clone(rec).(*framepackv1.Attempt)
				r.Change = fmt.Sprintf("lane %s degraded: %s; next probe in %v", w.cfg.Lane, reason, wait)
				j.retryEvent(r, wait)
			}
			if err := w.RecoverDevice(ctx, notify); err != nil {
				return err
			}
		}
		if s := w.health.Status(); s.State == LaneHeld {
			r := proto.Clone(rec).(*framepackv1.Attempt)
			r.Change = fmt.Sprintf("lane %s held: %s; the stage waits for the memory to come back", w.cfg.Lane, s.Reason)
			j.retryEvent(r, 0)
		}
		knobs = step.Knobs
		log.WithFields(logrus.Fields{"next_attempt": n + 1, "change": step.Change}).Info("watchdog: retrying stage")
	}
}

// knownTraits returns what st's model has that a retry can change: what the stage says (its
// worker's estimate), else what a worker of the model declared at an earlier Load on this lane.
func (w *Watchdog) knownTraits(st StageInfo) workerkit.ModelTraits {
	if !st.Traits.IsZero() {
		return st.Traits
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.traits[st.Model]
}

// checkRecovery runs the recovery check after an attempt's workers are gone and holds the
// lane when it fails. Without a baseline only the process groups are checked.
func (w *Watchdog) checkRecovery(ctx context.Context, a *Attempt, baseline uint64, haveBaseline bool) {
	rc := w.rec
	if !haveBaseline {
		r := *w.rec
		r.Memory = nil
		rc = &r
	}
	a.mu.Lock()
	pgids := a.pgids
	a.mu.Unlock()
	rctx := context.WithoutCancel(ctx) // a cancelled job still leaves the device to check
	res := RecoveryResult{Recovered: true}
	for _, pg := range pgids {
		if res = rc.Check(rctx, baseline, pg); !res.Recovered {
			break
		}
	}
	if len(pgids) == 0 {
		res = rc.Check(rctx, baseline, 0)
	}
	if !res.Recovered {
		w.hold(res)
	}
}

// GiveUpError is a job's failure: a stage failed and will not be tried again.
type GiveUpError struct {
	Stage StageInfo
	// Class is the last attempt's class.
	Class Class
	// Reason says why there is no further attempt.
	Reason string
	// Tries is the number of attempts of the stage.
	Tries int
	// Attempts is the job's whole story (Job.Story).
	Attempts []*framepackv1.Attempt
	// Err is the last attempt's error.
	Err error
}

// Error says which stage gave up, why, and the last attempt's error.
func (e *GiveUpError) Error() string {
	return fmt.Sprintf("stage %s failed (%s) after %d attempts: %s: %v", e.Stage.Name(), e.Class, e.Tries, e.Reason, e.Err)
}

// Unwrap returns the last attempt's error.
func (e *GiveUpError) Unwrap() error { return e.Err }

// Failure returns the failure as the job stores it, every attempt included.
func (e *GiveUpError) Failure() *framepackv1.JobFailure {
	return &framepackv1.JobFailure{Message: e.Error(), Stage: e.Stage.Kind, SectionIndex: e.Stage.Section, Attempts: e.Attempts}
}
