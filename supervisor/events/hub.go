// Package events is the per-job event hub of the supervisor: the job runner publishes every
// JobEvent of a job here, and WatchJob streams subscribe to them.
//
// The hub keeps each job's event log so that a watcher that attaches late gets the history
// first and then the live events, with no gap and no duplicate (subscribing copies the log and
// registers the watcher under one lock). Every event but previews and memory telemetry is also
// persisted (through Config.Persist, the job store) so the history survives a restart; of
// previews and telemetry only the latest of each is kept, in memory.
//
// Publishing never blocks on watchers. Each watcher has its own mailbox; when a watcher falls
// behind by more than its buffer, the hub drops from its mailbox, in this order, previews and
// telemetry, then the oldest sampling steps; stage, section, fallback and retry events and the
// terminal event are never dropped (there are a handful per section, so the mailbox stays
// small). A mailbox is a mutex-guarded slice with a one-slot notify channel rather than a
// buffered channel, because a channel cannot drop from its middle.
package events

import (
	"context"
	"errors"
	"fmt"
	"sync"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/sirupsen/logrus"
)

// Typed errors that callers act on.
var (
	// ErrClosed is returned by a subscription when the hub shuts down.
	ErrClosed = errors.New("events: hub closed")
	// ErrUnsubscribed is returned by Next after Close.
	ErrUnsubscribed = errors.New("events: subscription closed")
)

// Class says how the hub treats an event.
type Class int

const (
	// Ephemeral events (previews, memory telemetry) are not persisted; only the latest of each
	// kind is kept, and they are dropped first for slow watchers.
	Ephemeral Class = iota + 1
	// Progress events (sampling steps, decode progress) are persisted and replayed; a slow
	// watcher may lose the oldest of them.
	Progress
	// Durable events (stage started/finished, section video, fallback, retry) are persisted,
	// replayed and never dropped.
	Durable
	// Terminal events (job finished/failed/cancelled) end a job's log and are never dropped.
	Terminal
)

// ClassOf returns ev's class. Snapshots and empty events are Ephemeral (never published).
func ClassOf(ev *framepackv1.JobEvent) Class {
	switch ev.GetEvent().(type) {
	case *framepackv1.JobEvent_JobFinished, *framepackv1.JobEvent_JobFailed, *framepackv1.JobEvent_JobCancelled:
		return Terminal
	case *framepackv1.JobEvent_StageStarted, *framepackv1.JobEvent_StageFinished,
		*framepackv1.JobEvent_SectionVideo, *framepackv1.JobEvent_Fallback, *framepackv1.JobEvent_Retry:
		return Durable
	case *framepackv1.JobEvent_SamplingStep, *framepackv1.JobEvent_StageProgress:
		return Progress
	}
	return Ephemeral
}

// IsTerminal reports whether ev ends its job's stream.
func IsTerminal(ev *framepackv1.JobEvent) bool { return ClassOf(ev) == Terminal }

// DefaultWatcherBuffer is how many events a watcher may fall behind before the hub drops.
const DefaultWatcherBuffer = 256

// Config holds the hub's dependencies.
type Config struct {
	// Persist stores event seq of a job's log; required. Errors are logged, not fatal: the
	// live stream goes on.
	Persist func(jobID string, seq uint64, ev *framepackv1.JobEvent) error
	// Load returns a job's stored log and the seq after its last event; required. It fails
	// (wrapping the store's not-found error) for an unknown job.
	Load func(jobID string) ([]*framepackv1.JobEvent, uint64, error)
	// Log receives persistence errors; nil discards them.
	Log logrus.FieldLogger
	// WatcherBuffer is the mailbox size of a watcher; 0 means DefaultWatcherBuffer.
	WatcherBuffer int
	// Observe, when set, is handed every published event after the watchers (metrics); it
	// must not block and must not keep or change the event.
	Observe func(*framepackv1.JobEvent)
}

// Hub fans events out to watchers and keeps each job's log. It is safe for concurrent use.
type Hub struct {
	cfg Config
	log logrus.FieldLogger

	// mu protects jobs and closed; it is taken before any Subscription.mu.
	mu     sync.Mutex
	jobs   map[string]*jobLog
	closed bool
}

// jobLog is one job's log. Its fields other than pubMu are protected by Hub.mu.
type jobLog struct {
	events    []*framepackv1.JobEvent // Progress, Durable and Terminal events, in order
	next      uint64                  // seq of the next persisted event
	preview   *framepackv1.JobEvent   // latest preview
	telemetry *framepackv1.JobEvent   // latest memory telemetry
	subs      map[*Subscription]struct{}
	done      bool // a terminal event is in events

	// pubMu serialises the job's publishers (persist, then fan out); taken before h.mu.
	pubMu sync.Mutex
}

// New returns a hub.
func New(cfg Config) (*Hub, error) {
	if cfg.Persist == nil || cfg.Load == nil {
		return nil, fmt.Errorf("new event hub: Persist and Load are required")
	}
	if cfg.WatcherBuffer <= 0 {
		cfg.WatcherBuffer = DefaultWatcherBuffer
	}
	log := cfg.Log
	if log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		log = l
	}
	return &Hub{cfg: cfg, log: log, jobs: make(map[string]*jobLog)}, nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// lockLog returns job id's log with h.mu held, loading it from the store first if needed.
// On error h.mu is not held.
func (h *Hub) lockLog(id string) (*jobLog, error) {
	h.mu.Lock()
	if l, ok := h.jobs[id]; ok {
		return l, nil
	}
	h.mu.Unlock()
	evs, next, err := h.cfg.Load(id) // I/O outside the lock
	if err != nil {
		return nil, fmt.Errorf("load events of job %s: %w", id, err)
	}
	h.mu.Lock()
	if l, ok := h.jobs[id]; ok { // loaded meanwhile by someone else
		return l, nil
	}
	l := &jobLog{events: evs, next: next, subs: make(map[*Subscription]struct{})}
	for _, ev := range evs {
		if IsTerminal(ev) {
			l.done = true
		}
	}
	h.jobs[id] = l
	return l, nil
}

// Publish adds ev (whose job_id must be set) to its job's log, persists it unless it is
// ephemeral, then hands it to every watcher, so an event a watcher sees is already in the
// store. It never waits for a watcher; publishers of one job are serialised, of different
// jobs not. Publishing after the terminal event, a snapshot, or for an unknown job returns an
// error and changes nothing.
func (h *Hub) Publish(ev *framepackv1.JobEvent) error {
	id := ev.GetJobId()
	if id == "" || ev.GetEvent() == nil {
		return fmt.Errorf("publish event: no job id or payload")
	}
	if _, ok := ev.GetEvent().(*framepackv1.JobEvent_Snapshot); ok {
		return fmt.Errorf("publish event of job %s: snapshots are made by watchers", id)
	}
	l, err := h.lockLog(id)
	if err != nil {
		return fmt.Errorf("publish event: %w", err)
	}
	h.mu.Unlock()

	l.pubMu.Lock()
	defer l.pubMu.Unlock()
	h.mu.Lock()
	closed, done := h.closed, l.done
	h.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if done {
		return fmt.Errorf("publish event of job %s: job already ended", id)
	}
	class := ClassOf(ev)
	var persistErr error
	if class != Ephemeral {
		// l.next is only touched by publishers, who hold l.pubMu.
		if persistErr = h.cfg.Persist(id, l.next, ev); persistErr != nil {
			h.log.WithFields(logrus.Fields{"job": id, "seq": l.next}).WithError(persistErr).Error("persist job event")
			persistErr = fmt.Errorf("publish event of job %s: %w", id, persistErr)
		}
	}

	if h.cfg.Observe != nil {
		defer h.cfg.Observe(ev) // after h.mu is released, still under l.pubMu: in order per job
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch class {
	case Ephemeral:
		if _, ok := ev.GetEvent().(*framepackv1.JobEvent_Preview); ok {
			l.preview = ev
		} else {
			l.telemetry = ev
		}
	default:
		l.events = append(l.events, ev)
		l.next++
	}
	if class == Terminal {
		l.done = true
		l.preview, l.telemetry = nil, nil
	}
	for s := range l.subs {
		s.push(ev, class)
	}
	if l.done && len(l.subs) == 0 && h.jobs[id] == l {
		delete(h.jobs, id) // the store has it all
	}
	return persistErr
}

// SubscribeOptions says what a watcher wants.
type SubscribeOptions struct {
	// Previews asks for Preview events.
	Previews bool
}

// Subscribe returns job id's history (the log so far, then the latest telemetry and, with
// Previews, the latest preview, unless the job has ended) and a subscription that delivers
// every later event. The caller must Close the subscription.
func (h *Hub) Subscribe(id string, opts SubscribeOptions) ([]*framepackv1.JobEvent, *Subscription, error) {
	l, err := h.lockLog(id)
	if err != nil {
		return nil, nil, fmt.Errorf("subscribe: %w", err)
	}
	defer h.mu.Unlock()
	if h.closed {
		return nil, nil, ErrClosed
	}
	history := make([]*framepackv1.JobEvent, 0, len(l.events)+2)
	history = append(history, l.events...)
	if !l.done {
		if l.telemetry != nil {
			history = append(history, l.telemetry)
		}
		if opts.Previews && l.preview != nil {
			history = append(history, l.preview)
		}
	}
	s := &Subscription{
		hub:      h,
		jobID:    id,
		previews: opts.Previews,
		max:      h.cfg.WatcherBuffer,
		notify:   make(chan struct{}, 1),
	}
	l.subs[s] = struct{}{}
	return history, s, nil
}

// Close ends every subscription with ErrClosed (after what is already in its mailbox) and
// makes later Publish and Subscribe calls fail.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for _, l := range h.jobs {
		for s := range l.subs {
			s.fail(ErrClosed)
		}
	}
}

// Watchers returns how many subscriptions job id has; for tests and metrics.
func (h *Hub) Watchers(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if l, ok := h.jobs[id]; ok {
		return len(l.subs)
	}
	return 0
}

func (h *Hub) unsubscribe(s *Subscription) {
	h.mu.Lock()
	l, ok := h.jobs[s.jobID]
	if ok {
		delete(l.subs, s)
		if l.done && len(l.subs) == 0 {
			delete(h.jobs, s.jobID)
		}
	}
	h.mu.Unlock()
}

// Subscription is one watcher's mailbox.
type Subscription struct {
	hub      *Hub
	jobID    string
	previews bool
	max      int
	notify   chan struct{} // one slot: "the mailbox changed"

	// mu protects queue, err and dropped.
	mu      sync.Mutex
	queue   []*framepackv1.JobEvent
	err     error
	dropped int
}

// push adds ev to the mailbox, dropping what the package doc says when it is full.
// Caller holds hub.mu.
func (s *Subscription) push(ev *framepackv1.JobEvent, class Class) {
	if _, ok := ev.GetEvent().(*framepackv1.JobEvent_Preview); ok && !s.previews {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return
	}
	if len(s.queue) >= s.max {
		s.queue = s.dropWhere(s.queue, func(e *framepackv1.JobEvent) bool { return ClassOf(e) == Ephemeral }, -1)
	}
	if len(s.queue) >= s.max {
		switch class {
		case Ephemeral:
			s.dropped++
			return
		case Progress:
			s.queue = s.dropWhere(s.queue, func(e *framepackv1.JobEvent) bool { return ClassOf(e) == Progress }, 1)
			if len(s.queue) >= s.max {
				s.dropped++
				return
			}
		}
		// Durable and terminal events go in regardless: they are few.
	}
	s.queue = append(s.queue, ev)
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// dropWhere removes up to n events matching drop (all when n < 0), oldest first.
// Caller holds s.mu.
func (s *Subscription) dropWhere(q []*framepackv1.JobEvent, drop func(*framepackv1.JobEvent) bool, n int) []*framepackv1.JobEvent {
	out := q[:0]
	for _, e := range q {
		if n != 0 && drop(e) {
			s.dropped++
			n--
			continue
		}
		out = append(out, e)
	}
	clear(q[len(out):])
	return out
}

// fail ends the subscription with err once its mailbox is drained. Caller holds hub.mu.
func (s *Subscription) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Next returns the next event, waiting for one; it returns the hub's error once the hub is
// closed and the mailbox is empty, ErrUnsubscribed after Close, or ctx's error.
func (s *Subscription) Next(ctx context.Context) (*framepackv1.JobEvent, error) {
	for {
		s.mu.Lock()
		if errors.Is(s.err, ErrUnsubscribed) {
			s.mu.Unlock()
			return nil, ErrUnsubscribed
		}
		if len(s.queue) > 0 {
			ev := s.queue[0]
			s.queue[0] = nil
			s.queue = s.queue[1:]
			s.mu.Unlock()
			return ev, nil
		}
		err := s.err
		s.mu.Unlock()
		if err != nil {
			return nil, err
		}
		select {
		case <-s.notify:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// Dropped returns how many events this watcher lost to a full mailbox.
func (s *Subscription) Dropped() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// Close unsubscribes; later Next calls return ErrUnsubscribed. It is idempotent.
func (s *Subscription) Close() {
	s.hub.unsubscribe(s)
	s.mu.Lock()
	s.err = ErrUnsubscribed
	s.queue = nil
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Stream is one watcher's live events: a Hub's Subscription, or a cluster's event stream
// (supervisor/cluster).
type Stream interface {
	// Next returns the next event, waiting for one (see Subscription.Next).
	Next(ctx context.Context) (*framepackv1.JobEvent, error)
	// Dropped returns how many events the watcher lost by falling behind.
	Dropped() int
	// Close ends the stream; it is idempotent.
	Close()
}

// Watch is Subscribe returning the subscription as a Stream, so that the API serves a Hub
// and a cluster's event streams alike.
func (h *Hub) Watch(id string, opts SubscribeOptions) ([]*framepackv1.JobEvent, Stream, error) {
	history, sub, err := h.Subscribe(id, opts)
	if err != nil {
		return nil, nil, err
	}
	return history, sub, nil
}
