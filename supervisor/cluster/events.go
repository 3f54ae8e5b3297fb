package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/events"
)

func decodeRecord(b []byte) (*record, error) {
	rec := &record{}
	if err := json.Unmarshal(b, rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// Events carries job events between the daemons (api.Events): durable events on the events
// stream, one subject per job; previews and memory telemetry on the live stream, the newest
// of each kind kept.
type Events struct {
	cfg   Config
	log   logrus.FieldLogger
	js    jetstream.JetStream
	names names
	store *Store

	// mu protects streams and closed.
	mu      sync.Mutex
	streams map[*eventStream]struct{}
	closed  bool
}

var _ api.Events = (*Events)(nil)

func (e *Events) subject(id string) string { return e.names.eventsSubject + "." + id }

func (e *Events) liveSubject(id, kind string) string {
	return e.names.liveSubject + "." + id + "." + kind
}

// liveKind is the live subject's last token of an ephemeral event.
func liveKind(ev *framepackv1.JobEvent) string {
	if _, ok := ev.GetEvent().(*framepackv1.JobEvent_Preview); ok {
		return "preview"
	}
	return "telemetry"
}

// Publish stores ev in the cluster (job_id must be set): durable events are kept in order,
// each ephemeral kind only its newest.
func (e *Events) Publish(ev *framepackv1.JobEvent) error {
	id := ev.GetJobId()
	if id == "" || ev.GetEvent() == nil {
		return errors.New("publish event: no job id or payload")
	}
	if _, ok := ev.GetEvent().(*framepackv1.JobEvent_Snapshot); ok {
		return fmt.Errorf("publish event of job %s: snapshots are made by watchers", id)
	}
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return events.ErrClosed
	}
	b, err := proto.Marshal(ev)
	if err != nil {
		return fmt.Errorf("publish event of job %s: %w", id, err)
	}
	subj := e.subject(id)
	if events.ClassOf(ev) == events.Ephemeral {
		subj = e.liveSubject(id, liveKind(ev))
	}
	ctx, cancel := opContext()
	defer cancel()
	if _, err := e.js.Publish(ctx, subj, b); err != nil {
		return fmt.Errorf("publish event of job %s: %w", id, err)
	}
	if e.cfg.Observe != nil {
		e.cfg.Observe(ev)
	}
	return nil
}

// Watch returns job id's stored events and a stream of the later ones, through one ordered
// consumer of the job's subject (nothing falls between the history and the live events),
// with the live stream's telemetry and, with Previews, previews merged in.
func (e *Events) Watch(id string, opts events.SubscribeOptions) ([]*framepackv1.JobEvent, events.Stream, error) {
	if _, err := e.store.Get(id); err != nil {
		return nil, nil, fmt.Errorf("watch: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &eventStream{e: e, cancel: cancel, events: make(chan streamItem), notify: make(chan struct{}, 1)}
	history, err := s.start(ctx, id, opts)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("watch job %s: %w", id, err)
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		cancel()
		return nil, nil, events.ErrClosed
	}
	e.streams[s] = struct{}{}
	e.mu.Unlock()
	return history, s, nil
}

// Close ends every stream with events.ErrClosed and refuses later calls.
func (e *Events) Close() {
	e.mu.Lock()
	e.closed = true
	streams := make([]*eventStream, 0, len(e.streams))
	for s := range e.streams {
		streams = append(streams, s)
	}
	e.mu.Unlock()
	for _, s := range streams {
		s.fail(events.ErrClosed)
	}
}

// purge removes job id's events (the job is deleted).
func (e *Events) purge(ctx context.Context, id string) {
	for _, st := range []struct{ stream, subject string }{{e.names.eventsStream, e.subject(id)}, {e.names.liveStream, e.liveSubject(id, "*")}} {
		s, err := e.js.Stream(ctx, st.stream)
		if err == nil {
			err = s.Purge(ctx, jetstream.WithPurgeSubject(st.subject))
		}
		if err != nil {
			e.log.WithField("job", id).WithError(err).Warn("purge a deleted job's events")
		}
	}
}

// streamItem is an event or the error that ends a stream.
type streamItem struct {
	ev  *framepackv1.JobEvent
	err error
}

// eventStream is one watcher's stream (events.Stream).
type eventStream struct {
	e      *Events
	cancel context.CancelFunc
	events chan streamItem // durable events, in order (unbuffered: the consumer waits for the watcher)

	// mu protects live and err: the newest ephemeral event of each kind not yet read, and the
	// error that ends the stream.
	mu     sync.Mutex
	live   map[string]*framepackv1.JobEvent
	err    error
	notify chan struct{}
	once   sync.Once
}

// start reads the job's stored events up to the last one stored now and leaves the consumer
// running for the later ones.
func (s *eventStream) start(ctx context.Context, id string, opts events.SubscribeOptions) ([]*framepackv1.JobEvent, error) {
	e := s.e
	octx, cancel := opContext()
	defer cancel()
	stream, err := e.js.Stream(octx, e.names.eventsStream)
	if err != nil {
		return nil, err
	}
	var last uint64
	if m, err := stream.GetLastMsgForSubject(octx, e.subject(id)); err == nil {
		last = m.Sequence
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, err
	}
	cons, err := stream.OrderedConsumer(octx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{e.subject(id)}})
	if err != nil {
		return nil, err
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, err
	}
	var history []*framepackv1.JobEvent
	for last > 0 {
		m, err := it.Next()
		if err != nil {
			it.Stop()
			return nil, err
		}
		ev := &framepackv1.JobEvent{}
		meta, merr := m.Metadata()
		if err := proto.Unmarshal(m.Data(), ev); err == nil {
			history = append(history, ev)
		}
		if merr != nil || meta.Sequence.Stream >= last {
			break
		}
	}
	go s.follow(ctx, it)
	kinds := []string{"telemetry"}
	if opts.Previews {
		kinds = append(kinds, "preview")
	}
	for _, k := range kinds {
		if err := s.followLive(ctx, id, k); err != nil {
			it.Stop()
			return nil, err
		}
	}
	return history, nil
}

// follow hands the job's later durable events to Next.
func (s *eventStream) follow(ctx context.Context, it jetstream.MessagesContext) {
	defer it.Stop()
	go func() {
		<-ctx.Done()
		it.Stop()
	}()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() == nil {
				s.fail(fmt.Errorf("job events: %w", err))
			}
			return
		}
		ev := &framepackv1.JobEvent{}
		if err := proto.Unmarshal(m.Data(), ev); err != nil {
			continue
		}
		select {
		case s.events <- streamItem{ev: ev}:
		case <-ctx.Done():
			return
		}
	}
}

// followLive keeps the newest ephemeral event of one kind for Next.
func (s *eventStream) followLive(ctx context.Context, id, kind string) error {
	e := s.e
	octx, cancel := opContext()
	defer cancel()
	cons, err := e.js.OrderedConsumer(octx, e.names.liveStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{e.liveSubject(id, kind)}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy})
	if err != nil {
		return err
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		ev := &framepackv1.JobEvent{}
		if proto.Unmarshal(m.Data(), ev) != nil {
			return
		}
		s.mu.Lock()
		if s.live == nil {
			s.live = map[string]*framepackv1.JobEvent{}
		}
		s.live[kind] = ev
		s.mu.Unlock()
		select {
		case s.notify <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		cc.Stop()
	}()
	return nil
}

func (s *eventStream) fail(err error) {
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

// Next returns the next event: a durable one in order, or the newest preview or telemetry.
func (s *eventStream) Next(ctx context.Context) (*framepackv1.JobEvent, error) {
	for {
		select {
		case it := <-s.events:
			return it.ev, it.err
		default:
		}
		s.mu.Lock()
		for _, k := range []string{"telemetry", "preview"} {
			if ev := s.live[k]; ev != nil {
				delete(s.live, k)
				s.mu.Unlock()
				return ev, nil
			}
		}
		err := s.err
		s.mu.Unlock()
		if err != nil {
			return nil, err
		}
		select {
		case it := <-s.events:
			return it.ev, it.err
		case <-s.notify:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// Dropped is 0: durable events wait for the watcher, and only the newest preview and
// telemetry are ever offered.
func (s *eventStream) Dropped() int { return 0 }

// Close ends the stream.
func (s *eventStream) Close() {
	s.once.Do(func() {
		s.cancel()
		s.fail(events.ErrUnsubscribed)
		s.e.mu.Lock()
		delete(s.e.streams, s)
		s.e.mu.Unlock()
	})
}
