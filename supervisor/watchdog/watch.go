package watchdog

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/beacon"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// Target is what the watchdog needs of a running worker; *workerkit.Process has it.
type Target interface {
	// PID is the worker's pid, also its process group id.
	PID() int
	// Beacon reads the worker's beacon page without asking the worker.
	Beacon() (beacon.Snapshot, error)
	// Done is closed once the process has exited and been reaped.
	Done() <-chan struct{}
	// Exited says how the process ended, once it has.
	Exited() (workerkit.ExitStatus, bool)
	// Kill sends SIGKILL to the worker's process group and reaps it.
	Kill() error
}

var _ Target = (*workerkit.Process)(nil)

// DefaultPoll is how often Watch reads the beacon when Limits.Poll is zero.
const DefaultPoll = 100 * time.Millisecond

// Limits bound one stage attempt. Zero fields are not enforced (Poll: DefaultPoll).
type Limits struct {
	// Stage bounds the whole attempt (load and run) from the start of the watch.
	Stage time.Duration
	// Op is the deadline of an op that set none of its own on the beacon.
	Op time.Duration
	// Stall bounds the time without any beacon update while the worker is loading or running
	// but not inside an op (stuck in its own code between ops).
	Stall time.Duration
	// Poll is the period of beacon reads.
	Poll time.Duration
}

// VerdictKind is what the watchdog saw.
type VerdictKind int

// Verdict kinds. Every kind but VerdictExited is a hang.
const (
	// VerdictExited: the process ended while a stage call was in flight.
	VerdictExited VerdictKind = iota + 1
	// VerdictOpOverdue: the op in progress is past its deadline (its own, or Limits.Op).
	VerdictOpOverdue
	// VerdictStalled: no beacon update for Limits.Stall while loading or running between ops.
	VerdictStalled
	// VerdictStageDeadline: the attempt ran past Limits.Stage.
	VerdictStageDeadline
)

// IsHang reports whether the verdict is a hang (the watchdog kills the worker).
func (k VerdictKind) IsHang() bool { return k >= VerdictOpOverdue && k <= VerdictStageDeadline }

// String names the kind.
func (k VerdictKind) String() string {
	switch k {
	case VerdictExited:
		return "exited"
	case VerdictOpOverdue:
		return "op overdue"
	case VerdictStalled:
		return "stalled"
	case VerdictStageDeadline:
		return "stage deadline"
	}
	return fmt.Sprintf("verdict(%d)", int(k))
}

// Verdict is what the watchdog saw go wrong with one worker.
type Verdict struct {
	Kind VerdictKind
	// At is when the watchdog saw it; Elapsed the time since the watch began.
	At      time.Time
	Elapsed time.Duration
	// Beacon is the last beacon reading.
	Beacon beacon.Snapshot
	// Limit is the limit that was passed (hang kinds).
	Limit time.Duration
	// Exit is how the process ended (VerdictExited).
	Exit workerkit.ExitStatus
}

// Conv returns the convolution shape key and tier the worker was stuck in, if it was stuck in
// a conv tier attempt.
func (v *Verdict) Conv() (key, tier string, ok bool) {
	if v == nil || !v.Kind.IsHang() || !v.Beacon.InOp || v.Beacon.ConvKey == "" || v.Beacon.ConvTier == "" {
		return "", "", false
	}
	return v.Beacon.ConvKey, v.Beacon.ConvTier, true
}

// String describes the verdict in one lower-case line.
func (v *Verdict) String() string {
	if v == nil {
		return "no verdict"
	}
	s := v.Beacon
	switch v.Kind {
	case VerdictExited:
		return "worker exited during the stage: " + v.Exit.String()
	case VerdictOpOverdue:
		op := fmt.Sprintf("op %s #%d", s.Op, s.OpSeq)
		if key, tier, ok := v.Conv(); ok {
			op += fmt.Sprintf(" (%s at tier %s)", key, tier)
		}
		return fmt.Sprintf("hang: %s running %v, past its %v deadline", op, s.OpAge(v.At).Round(time.Millisecond), v.Limit)
	case VerdictStalled:
		return fmt.Sprintf("hang: no progress for %v while %s (last op %s #%d)", v.At.Sub(lastProgress(s, v.At.Add(-v.Elapsed))).Round(time.Millisecond),
			s.Phase, s.Op, s.OpSeq)
	case VerdictStageDeadline:
		return fmt.Sprintf("hang: stage still running after its %v deadline (op %s #%d, step %d/%d)", v.Limit, s.Op, s.OpSeq, s.Step, s.Steps)
	}
	return v.Kind.String()
}

// lastProgress is the later of the beacon's last write and the start of the watch.
func lastProgress(s beacon.Snapshot, start time.Time) time.Time {
	if s.Updated.After(start) {
		return s.Updated
	}
	return start
}

// active reports whether the beacon's phase is one in which the worker must make progress.
func active(p beacon.Phase) bool {
	return p == beacon.PhaseLoading || p == beacon.PhaseRunning || p == beacon.PhaseProbing
}

// judge returns the verdict for one beacon reading at now, or nil.
func judge(s beacon.Snapshot, start, now time.Time, lim Limits) *Verdict {
	v := &Verdict{At: now, Elapsed: now.Sub(start), Beacon: s}
	if lim.Stage > 0 && now.Sub(start) > lim.Stage {
		v.Kind, v.Limit = VerdictStageDeadline, lim.Stage
		return v
	}
	if !active(s.Phase) {
		return nil
	}
	if s.InOp {
		deadline := s.OpDeadline
		limit := deadline.Sub(s.OpStart)
		if deadline.IsZero() && lim.Op > 0 && !s.OpStart.IsZero() {
			deadline, limit = s.OpStart.Add(lim.Op), lim.Op
		}
		if !deadline.IsZero() && now.After(deadline) {
			v.Kind, v.Limit = VerdictOpOverdue, limit
			return v
		}
		return nil
	}
	if lim.Stall > 0 && now.Sub(lastProgress(s, start)) > lim.Stall {
		v.Kind, v.Limit = VerdictStalled, lim.Stall
		return v
	}
	return nil
}

// Watch watches p until ctx ends or it finds something wrong: the process exited, the op in
// progress is overdue, the beacon stalled, or the stage ran past its deadline. It sends at most
// one Verdict on the returned channel (buffered), then closes it; it closes it without a
// verdict when ctx ends. Watch only reports; Guard acts.
func Watch(ctx context.Context, p Target, lim Limits) <-chan Verdict {
	out := make(chan Verdict, 1)
	poll := lim.Poll
	if poll <= 0 {
		poll = DefaultPoll
	}
	start := time.Now()
	go func() {
		defer close(out)
		t := time.NewTicker(poll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-p.Done():
				if ctx.Err() != nil {
					return
				}
				st, _ := p.Exited()
				s, _ := p.Beacon()
				now := time.Now()
				out <- Verdict{Kind: VerdictExited, At: now, Elapsed: now.Sub(start), Beacon: s, Exit: st}
				return
			case <-t.C:
			}
			s, err := p.Beacon()
			if err != nil && !errors.Is(err, beacon.ErrTorn) {
				continue // the page is closed: the process is going; Done tells
			}
			if v := judge(s, start, time.Now(), lim); v != nil {
				out <- *v
				return
			}
		}
	}()
	return out
}

// Guard watches the workers of one stage attempt and kills a hung one. It is attached to each
// worker process as soon as the process exists (the lane's Stage.Guard hook) and detached
// before the lane tears the worker down on purpose. A Guard serves one attempt.
type Guard struct {
	lim Limits
	log *logrus.Entry

	// mu protects verdict, ops and stops.
	mu      sync.Mutex
	verdict *Verdict
	ops     uint64 // the highest beacon op number seen at a detach
	stops   []func()
}

// NewGuard returns a guard that enforces lim.
func NewGuard(lim Limits, log *logrus.Entry) *Guard {
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	return &Guard{lim: lim, log: log}
}

// Attach starts watching p. On a hang verdict the guard SIGKILLs p's process group and reaps
// it, so the stage call in flight fails; the verdict stays readable with Verdict. The returned
// stop ends the watch (idempotent) and must be called before a deliberate teardown.
func (g *Guard) Attach(p Target) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := Watch(ctx, p, g.lim)
	done := make(chan struct{})
	go func() {
		defer close(done)
		v, ok := <-ch
		if !ok {
			return
		}
		g.mu.Lock()
		if g.verdict == nil || (!g.verdict.Kind.IsHang() && v.Kind.IsHang()) {
			g.verdict = &v
		}
		g.mu.Unlock()
		log := g.log.WithFields(logrus.Fields{"pid": p.PID(), "verdict": v.Kind.String()})
		if !v.Kind.IsHang() {
			log.WithField("status", v.Exit.String()).Debug("watchdog: worker exited during stage")
			return
		}
		log.WithFields(logrus.Fields{"op": v.Beacon.Op, "op_seq": v.Beacon.OpSeq, "conv_key": v.Beacon.ConvKey,
			"tier": v.Beacon.ConvTier}).Warn("watchdog: " + v.String() + "; killing the worker's process group")
		if err := p.Kill(); err != nil {
			log.WithError(err).Error("watchdog: kill hung worker")
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			if s, err := p.Beacon(); err == nil || errors.Is(err, beacon.ErrTorn) {
				g.mu.Lock()
				g.ops = max(g.ops, s.OpSeq)
				g.mu.Unlock()
			}
			cancel()
			<-done
		})
	}
	g.mu.Lock()
	g.stops = append(g.stops, stop)
	g.mu.Unlock()
	return stop
}

// Verdict returns the verdict of the attempt: a hang if any watch saw one, else an exit if
// one was seen, else nil.
func (g *Guard) Verdict() *Verdict {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.verdict == nil {
		return nil
	}
	v := *g.verdict
	return &v
}

// Ops returns the number of ops the attempt's workers had begun when they were detached (the
// beacon's op numbering, which op-numbered faults use).
func (g *Guard) Ops() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ops
}

// Stop ends every watch of the guard (a lane that forgot a stop, or an attempt that ended
// early).
func (g *Guard) Stop() {
	g.mu.Lock()
	stops := g.stops
	g.stops = nil
	g.mu.Unlock()
	for _, s := range stops {
		s()
	}
}
