package jobs

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/events"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// ErrStopped is returned by a Queue that is not running (not started, or stopped).
var ErrStopped = errors.New("jobs: queue stopped")

// Config holds a Queue's dependencies. The function fields are what tests replace.
type Config struct {
	// Store keeps the jobs (a *Store on a single host); required.
	Store Backend
	// Shared, when set, is the queue this daemon shares with the other daemons of a cluster:
	// submissions go into it, and the queue takes jobs from it for its free lanes instead of
	// keeping its own pending list (see SharedQueue). Nil on a single host.
	Shared SharedQueue
	// Lanes are the lanes the queue runs jobs on, one job per lane at a time; required.
	Lanes []string
	// Run runs one job (Runner.Run of the pipeline); required.
	Run func(ctx context.Context, job *Job, emit func(*framepackv1.JobEvent)) (Result, error)
	// Publish hands an event to the event hub (events.Hub.Publish); required.
	Publish func(*framepackv1.JobEvent) error
	// Sections returns how many sections a job of spec runs (the pipeline's count), for the
	// job's progress and Job.TotalSections; nil leaves them 0 (unknown).
	Sections func(spec *framepackv1.JobSpec) int
	// Placement chooses among several lanes (health, free memory); the zero value takes the
	// first free lane (see Placement).
	Placement Placement
	// Log is the queue's logger; nil discards.
	Log logrus.FieldLogger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Queue runs queued jobs in submission order (FIFO), one at a time per lane, and takes them
// up again after a restart from their last checkpoint.
//
// One goroutine (loop) owns the queue's state: the pending list and the running jobs. Callers
// talk to it through typed channels, each request carrying a reply channel with a buffer of
// one; every job runs on a goroutine of its own that reports back on doneCh.
type Queue struct {
	cfg Config
	log logrus.FieldLogger

	submitCh chan submitReq
	cancelCh chan cancelReq
	doneCh   chan runDone
	drainCh  chan drainReq
	wakeCh   chan string   // a lane that was not ready changed state
	wantCh   chan int      // loop → taker: how many jobs the loop can start (Shared only)
	takenCh  chan taken    // taker → loop: a job taken from the shared queue
	lostCh   chan *run     // a running job's lease was lost (Shared only)
	started  chan struct{} // closed by Start
	stopped  chan struct{} // closed when loop returns
	draining chan struct{} // closed when a drain begins; Job.Draining

	// mu protects busy, a copy of lane → running job id for readers outside the loop.
	mu   sync.Mutex
	busy map[string]string
}

type submitReq struct {
	job   *framepackv1.Job
	reply chan struct{}
}

type cancelReq struct {
	id, reason string
	reply      chan cancelReply
}

type cancelReply struct {
	job *framepackv1.Job
	err error
}

type drainReq struct {
	grace time.Duration
	reply chan struct{}
}

type runDone struct {
	r   *run
	res Result
	err error
}

type pendingJob struct {
	id    string
	lane  string // the lane the job is pinned to; empty for any
	spec  *framepackv1.JobSpec
	lease Lease // the hold on a job taken from the shared queue; nil on a single host
}

// run is one running job.
type run struct {
	job    *Job
	lane   string
	cancel context.CancelCauseFunc
	ctx    context.Context
	first  time.Time // when the job first started, for JobResult.duration
	total  int
	lease  Lease // nil on a single host

	// ended says the job reached a final state while closed (cancelled), so that its lease
	// is done when the runner returns. Protected by mu.
	ended bool

	// mu protects closed and orders the job's events and store updates: the runner's emit
	// and the queue's terminal update both hold it, so nothing follows the terminal event.
	mu     sync.Mutex
	closed bool
}

// loopState is owned by the loop goroutine.
type loopState struct {
	pending  []pendingJob
	runs     map[string]*run // by job id
	byLane   map[string]*run
	drain    bool
	grace    <-chan time.Time
	waiters  []chan struct{}
	runCtx   context.Context
	stopRuns context.CancelCauseFunc
	watched  map[string]bool  // lanes not ready whose next change wakes the loop
	recheck  <-chan time.Time // set when a job waits for device memory
	wanted   int              // the jobs last asked of the shared queue (Shared only)
}

// NewQueue returns a queue; Start runs it.
func NewQueue(cfg Config) (*Queue, error) {
	if cfg.Store == nil || cfg.Run == nil || cfg.Publish == nil {
		return nil, fmt.Errorf("new job queue: Store, Run and Publish are required")
	}
	if len(cfg.Lanes) == 0 {
		return nil, fmt.Errorf("new job queue: no lanes")
	}
	seen := map[string]bool{}
	for _, l := range cfg.Lanes {
		if l == "" || seen[l] {
			return nil, fmt.Errorf("new job queue: empty or repeated lane %q", l)
		}
		seen[l] = true
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Log
	if log == nil {
		l := logrus.New()
		l.SetOutput(discardWriter{})
		log = l
	}
	return &Queue{
		cfg:      cfg,
		log:      log,
		submitCh: make(chan submitReq),
		cancelCh: make(chan cancelReq),
		doneCh:   make(chan runDone),
		drainCh:  make(chan drainReq),
		wakeCh:   make(chan string),
		wantCh:   make(chan int, 1),
		takenCh:  make(chan taken),
		lostCh:   make(chan *run),
		started:  make(chan struct{}),
		stopped:  make(chan struct{}),
		draining: make(chan struct{}),
		busy:     make(map[string]string),
	}, nil
}

type discardWriter struct{}

func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }

// Lanes returns the queue's lanes.
func (q *Queue) Lanes() []string { return slices.Clone(q.cfg.Lanes) }

// Running returns lane → id of the job running on it.
func (q *Queue) Running() map[string]string {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make(map[string]string, len(q.busy))
	for k, v := range q.busy {
		out[k] = v
	}
	return out
}

// Stopped is closed when the queue has stopped.
func (q *Queue) Stopped() <-chan struct{} { return q.stopped }

// Start takes up the unfinished jobs of the store (running ones go back to the queue and
// resume from their checkpoint) and starts the queue. Cancelling ctx stops the queue at once:
// running jobs are cancelled and stay RUNNING in the store, to resume at the next start;
// Drain is the graceful way.
func (q *Queue) Start(ctx context.Context) error {
	select {
	case <-q.started:
		return fmt.Errorf("start job queue: already started")
	default:
	}
	st := &loopState{runs: map[string]*run{}, byLane: map[string]*run{}}
	var jobs []*framepackv1.Job
	if q.cfg.Shared == nil { // a cluster's unfinished jobs are in its shared queue
		var err error
		if jobs, err = q.cfg.Store.Unfinished(); err != nil {
			return fmt.Errorf("start job queue: %w", err)
		}
	}
	for _, job := range jobs {
		lane := job.GetSpec().GetLane()
		if lane != "" && !slices.Contains(q.cfg.Lanes, lane) {
			q.failQueued(job.GetId(), fmt.Sprintf("lane %q does not exist on this server (lanes: %v)", lane, q.cfg.Lanes))
			continue
		}
		if job.GetState() == framepackv1.JobState_JOB_STATE_RUNNING {
			if _, err := q.cfg.Store.Update(job.GetId(), func(j *framepackv1.Job) error {
				j.State = framepackv1.JobState_JOB_STATE_QUEUED
				return nil
			}); err != nil {
				return fmt.Errorf("start job queue: requeue %s: %w", job.GetId(), err)
			}
			cp, _ := q.cfg.Store.Checkpoint(job.GetId())
			f := q.log.WithField("job", job.GetId())
			if cp != nil {
				f.WithField("section", cp.Section).Info("requeued interrupted job; resumes after its last finished section")
			} else {
				f.Info("requeued interrupted job; no section had finished")
			}
		}
		st.pending = append(st.pending, pendingJob{id: job.GetId(), lane: lane, spec: job.GetSpec()})
	}
	st.runCtx, st.stopRuns = context.WithCancelCause(context.WithoutCancel(ctx))
	close(q.started)
	if q.cfg.Shared != nil {
		go q.take(ctx)
	}
	go q.loop(ctx, st)
	return nil
}

// failQueued marks a queued job failed before it ran.
func (q *Queue) failQueued(id, msg string) {
	failure := &framepackv1.JobFailure{Message: msg}
	if _, err := q.cfg.Store.Update(id, func(j *framepackv1.Job) error {
		j.State = framepackv1.JobState_JOB_STATE_FAILED
		j.Failure = failure
		return nil
	}); err != nil {
		q.log.WithField("job", id).WithError(err).Error("mark job failed")
		return
	}
	q.publish(id, &framepackv1.JobEvent{Event: &framepackv1.JobEvent_JobFailed{JobFailed: &framepackv1.JobFailed{Failure: failure}}})
}

func (q *Queue) publish(id string, ev *framepackv1.JobEvent) {
	ev.JobId = id
	if ev.Time == nil {
		ev.Time = timestamppb.New(q.cfg.Now())
	}
	if err := q.cfg.Publish(ev); err != nil {
		q.log.WithField("job", id).WithError(err).Warn("publish job event")
	}
}

// Submit stores a new job (spec with defaults filled in, input image bytes) and queues it.
func (q *Queue) Submit(ctx context.Context, spec *framepackv1.JobSpec, image []byte) (*framepackv1.Job, error) {
	if err := q.accepting(); err != nil {
		return nil, err
	}
	job, err := q.cfg.Store.Create(spec, image)
	if err != nil {
		return nil, fmt.Errorf("submit job: %w", err)
	}
	return q.enqueue(ctx, job), nil
}

// SubmitOnce is Submit for a submission with a client request id (Store.CreateOnce): when a
// stored job was created by req.ID it returns that job as it is now, and false, without
// queuing anything.
func (q *Queue) SubmitOnce(ctx context.Context, req ClientRequest, spec *framepackv1.JobSpec, image []byte) (*framepackv1.Job, bool, error) {
	if err := q.accepting(); err != nil {
		return nil, false, err
	}
	job, created, err := q.cfg.Store.CreateOnce(req, spec, image)
	if err != nil {
		return nil, false, fmt.Errorf("submit job: %w", err)
	}
	if !created {
		return job, false, nil
	}
	return q.enqueue(ctx, job), true, nil
}

// accepting is ErrStopped before Start and after the queue stopped.
func (q *Queue) accepting() error {
	select {
	case <-q.started:
	default:
		return ErrStopped
	}
	select {
	case <-q.stopped:
		return ErrStopped
	default:
	}
	return nil
}

// enqueue hands a stored job to the loop and waits until the loop has it; a queue that stops
// first, or a caller that gives up, leaves it stored: it runs at the next start.
func (q *Queue) enqueue(ctx context.Context, job *framepackv1.Job) *framepackv1.Job {
	if q.cfg.Shared != nil {
		if err := q.cfg.Shared.Put(ctx, job.GetId()); err != nil {
			// Stored but not queued: it is QUEUED in the store and nobody will take it.
			q.failQueued(job.GetId(), fmt.Sprintf("could not queue the job in the cluster: %v", err))
			if j, gerr := q.cfg.Store.Get(job.GetId()); gerr == nil {
				return j
			}
		}
		return job
	}
	req := submitReq{job: job, reply: make(chan struct{}, 1)}
	select {
	case q.submitCh <- req:
	case <-q.stopped:
		return job
	case <-ctx.Done():
		return job
	}
	select {
	case <-req.reply:
	case <-q.stopped:
	case <-ctx.Done():
	}
	return job
}

// Cancel cancels job id: a queued job leaves the queue, a running job's context is cancelled
// (its Runner kills the worker) and the job is CANCELLED at once; its lane takes the next job
// when the Runner has returned. A finished job is returned unchanged.
func (q *Queue) Cancel(ctx context.Context, id, reason string) (*framepackv1.Job, error) {
	req := cancelReq{id: id, reason: reason, reply: make(chan cancelReply, 1)}
	select {
	case q.cancelCh <- req:
	case <-q.stopped:
		return q.cancelStopped(id, reason)
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	select {
	case r := <-req.reply:
		return r.job, r.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// cancelStopped cancels a job while the queue is not running: nothing runs, so the store is
// all there is.
func (q *Queue) cancelStopped(id, reason string) (*framepackv1.Job, error) {
	job, changed, err := q.markCancelled(id)
	if err != nil {
		return nil, err
	}
	if changed {
		q.publish(id, cancelledEvent(reason))
	}
	return job, nil
}

// markCancelled sets a job that has not ended to CANCELLED and says whether it changed it.
func (q *Queue) markCancelled(id string) (*framepackv1.Job, bool, error) {
	changed := false
	job, err := q.cfg.Store.Update(id, func(j *framepackv1.Job) error {
		if isFinal(j.GetState()) {
			return errUnchanged
		}
		j.State = framepackv1.JobState_JOB_STATE_CANCELLED
		changed = true
		return nil
	})
	if errors.Is(err, errUnchanged) {
		job, err = q.cfg.Store.Get(id)
	}
	if err != nil {
		return nil, false, fmt.Errorf("cancel job: %w", err)
	}
	return job, changed, nil
}

var errUnchanged = errors.New("unchanged")

func isFinal(s framepackv1.JobState) bool {
	switch s {
	case framepackv1.JobState_JOB_STATE_SUCCEEDED, framepackv1.JobState_JOB_STATE_FAILED, framepackv1.JobState_JOB_STATE_CANCELLED:
		return true
	}
	return false
}

func cancelledEvent(reason string) *framepackv1.JobEvent {
	return &framepackv1.JobEvent{Event: &framepackv1.JobEvent_JobCancelled{JobCancelled: &framepackv1.JobCancelled{Reason: reason}}}
}

// Drain stops the queue gracefully: no job starts any more, running jobs see Job.Draining
// closed and get grace to stop on their own (at a stage boundary, after their checkpoint),
// then their context is cancelled. Interrupted jobs go back to QUEUED and resume at the next
// start; queued jobs stay queued. Drain returns when no job runs, or with ctx's error.
func (q *Queue) Drain(ctx context.Context, grace time.Duration) error {
	select {
	case <-q.started:
	default:
		return nil
	}
	req := drainReq{grace: grace, reply: make(chan struct{}, 1)}
	select {
	case q.drainCh <- req:
	case <-q.stopped:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("drain job queue: %w", context.Cause(ctx))
	}
	select {
	case <-req.reply:
		return nil
	case <-q.stopped:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("drain job queue: %w", context.Cause(ctx))
	}
}

func (q *Queue) loop(ctx context.Context, st *loopState) {
	defer close(q.stopped)
	q.schedule(st)
	for {
		select {
		case <-ctx.Done():
			q.releasePending(st)
			st.stopRuns(ErrShutdown)
			for _, r := range st.runs {
				q.log.WithFields(logrus.Fields{"job": r.job.ID, "lane": r.lane}).Warn("queue stopped: job left running in the store, resumes at next start")
			}
			return
		case req := <-q.submitCh:
			st.pending = append(st.pending, pendingJob{id: req.job.GetId(), lane: req.job.GetSpec().GetLane(), spec: req.job.GetSpec()})
			req.reply <- struct{}{}
		case req := <-q.cancelCh:
			job, err := q.handleCancel(st, req.id, req.reason)
			req.reply <- cancelReply{job: job, err: err}
		case d := <-q.doneCh:
			q.handleDone(st, d)
		case t := <-q.takenCh:
			st.wanted--
			q.handleTaken(st, t)
		case r := <-q.lostCh:
			q.handleLost(st, r)
		case lane := <-q.wakeCh:
			delete(st.watched, lane)
		case <-st.recheck:
			st.recheck = nil
		case req := <-q.drainCh:
			if !st.drain {
				st.drain = true
				close(q.draining)
				st.grace = time.After(req.grace)
				q.releasePending(st)
				q.log.WithFields(logrus.Fields{"running": len(st.runs), "grace": req.grace}).Info("draining job queue")
			}
			st.waiters = append(st.waiters, req.reply)
		case <-st.grace:
			st.grace = nil
			for _, r := range st.runs {
				q.log.WithField("job", r.job.ID).Warn("shutdown grace over: cancelling running job")
				r.cancel(ErrShutdown)
			}
		}
		q.schedule(st)
		if st.drain && len(st.runs) == 0 {
			for _, w := range st.waiters {
				w <- struct{}{}
			}
			return
		}
	}
}

// schedule starts pending jobs, oldest first, on the free lanes that can take them (see
// Placement). Loop goroutine only.
func (q *Queue) schedule(st *loopState) {
	if st.drain {
		return
	}
	var pl *placement
	if len(st.pending) > 0 || q.cfg.Shared != nil { // lanes' health and device memory are read only when a job may wait
		pl = q.freeLanes(st)
	} else {
		pl = &placement{q: q, st: st}
	}
	for i := 0; i < len(st.pending) && len(pl.free) > 0; i++ {
		p := st.pending[i]
		c, ok := pl.pick(p)
		if !ok && p.lease != nil {
			// Another daemon may have the lane or the memory: give the job back.
			st.pending = slices.Delete(st.pending, i, i+1)
			i--
			p.lease.Release(releaseDelay)
			continue
		}
		if !ok {
			if why := q.neverFits(p, pl.need(p)); why != "" {
				st.pending = slices.Delete(st.pending, i, i+1)
				i--
				q.failQueued(p.id, why)
				continue
			}
			continue // no free lane can take it now; a later job may fit another lane
		}
		st.pending = slices.Delete(st.pending, i, i+1)
		i--
		if !q.startRun(st, c.name, p) {
			pl.free = append(pl.free, c) // the job could not start; the lane stays free
		}
	}
	q.wantMore(st, len(pl.free))
	if pl.short && st.recheck == nil && len(st.pending) > 0 {
		every := q.cfg.Placement.Recheck
		if every <= 0 {
			every = DefaultRecheck
		}
		st.recheck = time.After(every)
	}
	q.mu.Lock()
	clear(q.busy)
	for lane, r := range st.byLane {
		q.busy[lane] = r.job.ID
	}
	q.mu.Unlock()
}

// startRun starts job id on lane and reports whether it did. Loop goroutine only.
func (q *Queue) startRun(st *loopState, lane string, p pendingJob) bool {
	id := p.id
	log := q.log.WithFields(logrus.Fields{"job": id, "lane": lane})
	var total int
	job, err := q.cfg.Store.Update(id, func(j *framepackv1.Job) error {
		// A job taken again from a shared queue is still RUNNING when the daemon that ran it
		// died: its lease is this daemon's now.
		taken := p.lease != nil && j.GetState() == framepackv1.JobState_JOB_STATE_RUNNING
		if j.GetState() != framepackv1.JobState_JOB_STATE_QUEUED && !taken {
			return fmt.Errorf("job is %s, not queued", j.GetState())
		}
		if q.cfg.Sections != nil {
			total = q.cfg.Sections(j.GetSpec())
		}
		j.State = framepackv1.JobState_JOB_STATE_RUNNING
		j.Lane = lane
		if j.Progress == nil {
			j.Progress = &framepackv1.JobProgress{}
		}
		j.Progress.TotalSections = uint32(total)
		j.Progress.TotalSteps = j.GetSpec().GetSteps()
		return nil
	})
	if err != nil {
		log.WithError(err).Error("start job")
		if p.lease != nil {
			q.endLease(id, p.lease)
		}
		return false
	}
	prep, err := q.cfg.Store.Prepare(id)
	if err != nil {
		// The job stays RUNNING with nothing running it: a restart (or, in a cluster, the
		// lease given back) takes it up again.
		log.WithError(err).Error("prepare job")
		if p.lease != nil {
			p.lease.Release(releaseDelay)
		}
		return false
	}
	first := prep.FirstStart
	if first.IsZero() {
		first = q.cfg.Now()
	}
	cp := prep.Resume
	ctx, cancel := context.WithCancelCause(st.runCtx)
	r := &run{lane: lane, cancel: cancel, ctx: ctx, first: first, total: total, lease: p.lease}
	r.job = &Job{
		ID:             id,
		Spec:           proto.Clone(job.GetSpec()).(*framepackv1.JobSpec),
		Lane:           lane,
		Dir:            prep.Dir,
		InputPath:      prep.InputPath,
		EndImagePath:   prep.EndImagePath,
		KeyframePaths:  prep.KeyframePaths,
		VideoPath:      prep.VideoPath,
		TotalSections:  total,
		Resume:         cp,
		Draining:       q.draining,
		saveCheckpoint: func(c Checkpoint) error { return q.cfg.Store.SaveCheckpoint(id, c) },
	}
	st.runs[id] = r
	st.byLane[lane] = r
	go q.watchLease(r)
	f := log.WithField("sections", total)
	if cp != nil {
		f = f.WithField("resume_after_section", cp.Section)
	}
	f.Info("job started")
	go q.execute(r)
	return true
}

// execute runs one job on its own goroutine and reports to the loop.
func (q *Queue) execute(r *run) {
	var res Result
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("runner panicked: %v", p)
				q.log.WithField("job", r.job.ID).WithField("stack", string(debug.Stack())).Error("runner panicked")
			}
		}()
		res, err = q.cfg.Run(r.ctx, r.job, q.emitter(r))
	}()
	if removed, perr := q.cfg.Store.RemovePartials(r.job.ID); perr != nil || len(removed) > 0 {
		q.log.WithField("job", r.job.ID).WithField("removed", removed).WithError(perr).Info("removed partial files")
	}
	select {
	case q.doneCh <- runDone{r: r, res: res, err: err}:
	case <-q.stopped:
	}
}

// emitter returns the emit function handed to a Runner.
func (q *Queue) emitter(r *run) func(*framepackv1.JobEvent) {
	return func(ev *framepackv1.JobEvent) {
		if ev == nil || ev.GetEvent() == nil {
			return
		}
		class := events.ClassOf(ev)
		if _, snap := ev.GetEvent().(*framepackv1.JobEvent_Snapshot); snap || class == events.Terminal {
			q.log.WithField("job", r.job.ID).Warn("runner emitted a terminal event or snapshot; ignored")
			return
		}
		ev = proto.Clone(ev).(*framepackv1.JobEvent)
		ev.JobId = r.job.ID
		if ev.Time == nil {
			ev.Time = timestamppb.New(q.cfg.Now())
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.closed {
			return
		}
		if err := q.cfg.Publish(ev); err != nil {
			q.log.WithField("job", r.job.ID).WithError(err).Debug("publish job event")
		}
		if class == events.Ephemeral {
			return
		}
		if _, err := q.cfg.Store.Update(r.job.ID, func(j *framepackv1.Job) error {
			if j.Progress == nil {
				j.Progress = &framepackv1.JobProgress{}
			}
			applyProgress(j.Progress, ev, r.total)
			if l := ev.GetStageFinished().GetLoras(); len(l) > 0 {
				j.LorasApplied = l // the LoRAs the transformer merged, with the weights each changed
			}
			return nil
		}); err != nil {
			q.log.WithField("job", r.job.ID).WithError(err).Warn("record job progress")
		}
	}
}

// perSection reports whether a stage runs once per section.
func perSection(s framepackv1.Stage) bool {
	switch s {
	case framepackv1.Stage_STAGE_TRANSFORMER, framepackv1.Stage_STAGE_VAE_DECODE, framepackv1.Stage_STAGE_WRITE_VIDEO:
		return true
	}
	return false
}

// applyProgress folds ev into p: stage, section, step, eta, latest video and the share done
// (the event's estimate, else sections done plus the current section's steps, over all
// sections; never going back).
func applyProgress(p *framepackv1.JobProgress, ev *framepackv1.JobEvent, total int) {
	if total < 1 {
		total = 1
	}
	frac := float32(-1)
	switch e := ev.GetEvent().(type) {
	case *framepackv1.JobEvent_StageStarted:
		p.Stage = e.StageStarted.GetStage()
		if perSection(p.Stage) {
			p.SectionIndex = e.StageStarted.GetSectionIndex()
		}
		if p.Stage == framepackv1.Stage_STAGE_TRANSFORMER {
			p.Step = 0
		}
	case *framepackv1.JobEvent_StageFinished:
		p.Stage = e.StageFinished.GetStage()
	case *framepackv1.JobEvent_SamplingStep:
		s := e.SamplingStep
		p.Stage = framepackv1.Stage_STAGE_TRANSFORMER
		p.SectionIndex, p.Step, p.TotalSteps = s.GetSectionIndex(), s.GetStep(), s.GetTotalSteps()
		p.Eta = s.GetEta()
		switch {
		case s.GetFraction() > 0:
			frac = s.GetFraction()
		case s.GetTotalSteps() > 0:
			frac = (float32(s.GetSectionIndex()) + float32(s.GetStep())/float32(s.GetTotalSteps())) / float32(total)
		}
	case *framepackv1.JobEvent_StageProgress:
		s := e.StageProgress
		p.Stage = s.GetStage()
		if perSection(p.Stage) {
			p.SectionIndex = s.GetSectionIndex()
		}
		if s.GetEta() != nil {
			p.Eta = s.GetEta()
		}
		frac = s.GetFraction()
	case *framepackv1.JobEvent_SectionVideo:
		p.SectionIndex = e.SectionVideo.GetSectionIndex()
		p.LatestVideoPath = e.SectionVideo.GetPath()
		frac = float32(e.SectionVideo.GetSectionIndex()+1) / float32(total)
	}
	if frac > p.Fraction {
		p.Fraction = min(frac, 1)
	}
}

// handleCancel is Cancel on the loop goroutine.
func (q *Queue) handleCancel(st *loopState, id, reason string) (*framepackv1.Job, error) {
	log := q.log.WithField("job", id)
	if i := slices.IndexFunc(st.pending, func(p pendingJob) bool { return p.id == id }); i >= 0 {
		p := st.pending[i]
		st.pending = slices.Delete(st.pending, i, i+1)
		job, changed, err := q.markCancelled(id)
		if p.lease != nil {
			q.endLease(id, p.lease)
		}
		if err != nil {
			return nil, err
		}
		if changed {
			q.publish(id, cancelledEvent(reason))
			log.Info("queued job cancelled")
		}
		return job, nil
	}
	if r, ok := st.runs[id]; ok {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.closed {
			return q.cfg.Store.Get(id)
		}
		r.closed = true
		r.cancel(ErrCancelled)
		job, changed, err := q.markCancelled(id)
		if err != nil {
			return nil, err
		}
		r.ended = true
		if changed {
			q.publish(id, cancelledEvent(reason))
		}
		log.WithField("lane", r.lane).Info("running job cancelled; waiting for its runner to stop")
		return job, nil
	}
	// Neither pending nor running: finished (returned unchanged) or unknown.
	job, changed, err := q.markCancelled(id)
	if err != nil {
		return nil, err
	}
	if changed {
		q.publish(id, cancelledEvent(reason))
	}
	return job, nil
}

// handleDone records how a run ended. Loop goroutine only.
func (q *Queue) handleDone(st *loopState, d runDone) {
	r := d.r
	delete(st.runs, r.job.ID)
	if st.byLane[r.lane] == r {
		delete(st.byLane, r.lane)
	}
	log := q.log.WithFields(logrus.Fields{"job": r.job.ID, "lane": r.lane})
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed { // cancelled, or the lease lost: already recorded
		log.WithError(d.err).Info("cancelled job's runner stopped")
		if r.lease != nil && r.ended {
			r.lease.Done()
		}
		return
	}
	r.closed = true
	if r.lease != nil {
		select {
		case <-r.lease.Lost(): // another daemon has the job now, or cancelled it
			log.WithError(d.err).Info("job's lease lost while its runner stopped; nothing recorded here")
			return
		default:
		}
	}
	interrupted := st.drain && d.err != nil &&
		(errors.Is(d.err, ErrInterrupted) || errors.Is(context.Cause(r.ctx), ErrShutdown))
	switch {
	case interrupted:
		if _, err := q.cfg.Store.Update(r.job.ID, func(j *framepackv1.Job) error {
			j.State = framepackv1.JobState_JOB_STATE_QUEUED
			return nil
		}); err != nil {
			log.WithError(err).Error("requeue interrupted job")
		}
		if r.lease != nil {
			r.lease.Release(0) // another daemon resumes it from its checkpoint
			log.WithError(d.err).Info("job interrupted by shutdown; given back to the cluster's queue")
			return
		}
		log.WithError(d.err).Info("job interrupted by shutdown; resumes at next start")
	case d.err == nil && d.res.VideoPath == "":
		q.finishFailed(r, errors.New("runner returned no video"), log)
	case d.err == nil:
		result := &framepackv1.JobResult{
			VideoPath:  d.res.VideoPath,
			FrameCount: uint32(max(d.res.FrameCount, 0)),
			Duration:   durationpb.New(q.cfg.Now().Sub(r.first)),
		}
		if _, err := q.cfg.Store.Update(r.job.ID, func(j *framepackv1.Job) error {
			j.State = framepackv1.JobState_JOB_STATE_SUCCEEDED
			j.Result = result
			if j.Progress == nil {
				j.Progress = &framepackv1.JobProgress{}
			}
			j.Progress.Fraction = 1
			j.Progress.Eta = nil
			return nil
		}); errors.Is(err, ErrLeaseLost) {
			log.Warn("job finished here but another daemon had taken it over; its result is the other daemon's")
			return
		} else if err != nil {
			log.WithError(err).Error("record job success")
		}
		q.doneLease(r)
		q.publish(r.job.ID, &framepackv1.JobEvent{Event: &framepackv1.JobEvent_JobFinished{JobFinished: &framepackv1.JobFinished{Result: result}}})
		f := log.WithFields(logrus.Fields{"video": result.VideoPath, "frames": result.FrameCount})
		if d.res.PNGFrames {
			f.Warn("job finished; video kept as PNG frames (no ffmpeg)")
		} else {
			f.Info("job finished")
		}
	default:
		q.finishFailed(r, d.err, log)
	}
}

// finishFailed records a failed run. Caller holds r.mu.
func (q *Queue) finishFailed(r *run, runErr error, log logrus.FieldLogger) {
	var failure *framepackv1.JobFailure
	if _, err := q.cfg.Store.Update(r.job.ID, func(j *framepackv1.Job) error {
		failure = failureOf(runErr, j.GetProgress())
		j.State = framepackv1.JobState_JOB_STATE_FAILED
		j.Failure = failure
		return nil
	}); errors.Is(err, ErrLeaseLost) {
		log.WithError(runErr).Warn("job failed here but another daemon had taken it over")
		return
	} else if err != nil {
		log.WithError(err).Error("record job failure")
		failure = failureOf(runErr, nil)
	}
	q.doneLease(r)
	q.publish(r.job.ID, &framepackv1.JobEvent{Event: &framepackv1.JobEvent_JobFailed{JobFailed: &framepackv1.JobFailed{Failure: failure}}})
	log.WithError(runErr).Warn("job failed")
}

// doneLease removes a job that ended from the shared queue.
func (q *Queue) doneLease(r *run) {
	if r.lease != nil {
		r.lease.Done()
	}
}

// endLease ends the lease of a job taken from the shared queue that does not run here: done
// when the job has ended or is gone, else given back for any daemon to take.
func (q *Queue) endLease(id string, l Lease) {
	job, err := q.cfg.Store.Get(id)
	if errors.Is(err, ErrNotFound) || (err == nil && isFinal(job.GetState())) {
		l.Done()
		return
	}
	l.Release(releaseDelay)
}

// handleTaken adds a job taken from the shared queue to the pending list (schedule starts it
// or gives it back). Loop goroutine only.
func (q *Queue) handleTaken(st *loopState, t taken) {
	job, err := q.cfg.Store.Get(t.id)
	if err != nil || isFinal(job.GetState()) || st.drain || st.runs[t.id] != nil {
		if err != nil && !errors.Is(err, ErrNotFound) {
			q.log.WithField("job", t.id).WithError(err).Warn("read a job taken from the cluster's queue")
		}
		if st.runs[t.id] != nil || st.drain {
			t.lease.Release(0)
			return
		}
		q.endLease(t.id, t.lease)
		return
	}
	st.pending = append(st.pending, pendingJob{id: t.id, lane: job.GetSpec().GetLane(), spec: job.GetSpec(), lease: t.lease})
}

// releasePending gives the pending jobs taken from the shared queue back to it (the daemon
// stops). Loop goroutine only.
func (q *Queue) releasePending(st *loopState) {
	kept := st.pending[:0]
	for _, p := range st.pending {
		if p.lease != nil {
			p.lease.Release(0)
			continue
		}
		kept = append(kept, p)
	}
	st.pending = kept
}
