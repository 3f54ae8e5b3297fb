package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/types/known/timestamppb"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/jobs"
)

func timestampNow(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

// Queue is the cluster's shared job queue (jobs.SharedQueue) on the work-queue stream.
type Queue struct {
	cfg   Config
	log   logrus.FieldLogger
	js    jetstream.JetStream
	names names
	cons  jetstream.Consumer
	store *Store

	// mu protects held: the leases this daemon holds, to give back on Close.
	mu   sync.Mutex
	held map[*lease]struct{}
}

var _ jobs.SharedQueue = (*Queue)(nil)

// Put queues job id: one message on the work-queue stream, deduplicated by the job id.
func (q *Queue) Put(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := q.js.Publish(ctx, q.names.queueSubject, []byte(id), jetstream.WithMsgID(id)); err != nil {
		return fmt.Errorf("queue job %s in the cluster: %w", id, err)
	}
	return nil
}

// Take waits up to a couple of seconds for a queued job, makes this daemon its owner and
// returns it with a lease that keeps it from being redelivered while the daemon lives. Jobs
// that ended or are gone are acknowledged and skipped.
func (q *Queue) Take(ctx context.Context) (string, jobs.Lease, error) {
	batch, err := q.cons.Fetch(1, jetstream.FetchMaxWait(takeWait))
	if err != nil {
		return "", nil, fmt.Errorf("take a job: %w", err)
	}
	var msg jetstream.Msg
	for m := range batch.Messages() {
		msg = m
	}
	if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
		if msg == nil {
			return "", nil, fmt.Errorf("take a job: %w", err)
		}
	}
	if msg == nil {
		return "", nil, ctx.Err()
	}
	id := string(msg.Data())
	meta, err := msg.Metadata()
	if err != nil {
		_ = msg.Nak()
		return "", nil, fmt.Errorf("take a job: %w", err)
	}
	log := q.log.WithFields(logrus.Fields{"job": id, "delivery": meta.NumDelivered})
	if !jobs.ValidID(id) {
		log.Warn("cluster queue holds a message that is no job id; dropped")
		_ = msg.Term()
		return "", nil, nil
	}
	token := fmt.Sprintf("%s/%d/%d", q.cfg.Node, meta.Sequence.Stream, meta.NumDelivered)
	ok, err := q.store.claim(id, token)
	if err != nil {
		_ = msg.NakWithDelay(time.Second)
		return "", nil, fmt.Errorf("take job %s: %w", id, err)
	}
	if !ok {
		log.Debug("queued job has ended or is gone; removed from the cluster's queue")
		_ = msg.Ack()
		return "", nil, nil
	}
	if meta.NumDelivered > 1 {
		log.Info("took over a job from the cluster's queue (its daemon gave it back or stopped answering)")
	} else {
		log.Debug("took a job from the cluster's queue")
	}
	l := q.newLease(id, token, msg)
	return id, l, nil
}

// lease is this daemon's hold on one job: the unacknowledged queue message, renewed every
// AckWait/3, and a watch of the job's record that sees another owner or a cancel.
type lease struct {
	q      *Queue
	id     string
	token  string
	msg    jetstream.Msg
	lost   chan struct{}
	stop   context.CancelFunc
	once   sync.Once
	lostMu sync.Once
}

func (q *Queue) newLease(id, token string, msg jetstream.Msg) *lease {
	ctx, cancel := context.WithCancel(context.Background())
	l := &lease{q: q, id: id, token: token, msg: msg, lost: make(chan struct{}), stop: cancel}
	q.mu.Lock()
	if q.held == nil {
		q.held = map[*lease]struct{}{}
	}
	q.held[l] = struct{}{}
	q.mu.Unlock()
	go l.renew(ctx)
	go l.watch(ctx)
	return l
}

// renew tells JetStream the job is still in progress, every AckWait/3.
func (l *lease) renew(ctx context.Context) {
	t := time.NewTicker(max(l.q.cfg.AckWait/3, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := l.msg.InProgress(); err != nil {
				l.q.log.WithField("job", l.id).WithError(err).Warn("renew the hold on a running job")
			}
		}
	}
}

// watch closes lost when the job's record names another owner or the job ended while this
// daemon holds it (cancelled through another daemon).
func (l *lease) watch(ctx context.Context) {
	w, err := l.q.store.kv.Watch(ctx, jobKey(l.id), jetstream.UpdatesOnly())
	if err != nil {
		l.q.log.WithField("job", l.id).WithError(err).Warn("watch a running job's record")
		return
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				l.markLost("its record was deleted")
				return
			}
			rec, err := decodeRecord(e.Value())
			if err != nil {
				continue
			}
			if rec.Owner != l.token {
				l.markLost("owner now " + rec.Owner)
				return
			}
			if job, err := l.q.store.decode(rec); err == nil && job.GetState() == framepackv1.JobState_JOB_STATE_CANCELLED {
				l.markLost("cancelled")
				return
			}
		}
	}
}

func (l *lease) markLost(why string) {
	l.lostMu.Do(func() {
		l.q.log.WithFields(logrus.Fields{"job": l.id, "why": why}).Info("lease on a job lost")
		close(l.lost)
	})
}

// Lost is closed when the job is no longer this daemon's.
func (l *lease) Lost() <-chan struct{} { return l.lost }

// Done acknowledges the job's message: the job ended and leaves the queue.
func (l *lease) Done() {
	l.end(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		return l.msg.DoubleAck(ctx)
	})
}

// Release gives the job back: JetStream redelivers it after delay to any daemon.
func (l *lease) Release(delay time.Duration) {
	l.end(func() error {
		if delay > 0 {
			return l.msg.NakWithDelay(delay)
		}
		return l.msg.Nak()
	})
}

func (l *lease) end(fn func() error) {
	l.once.Do(func() {
		l.stop()
		l.q.store.unlease(l.id, l.token)
		l.q.mu.Lock()
		delete(l.q.held, l)
		l.q.mu.Unlock()
		if err := fn(); err != nil {
			l.q.log.WithField("job", l.id).WithError(err).Warn("answer the cluster's queue for a job; it is redelivered after the ack wait")
		}
	})
}

// releaseAll gives back every lease still held (the daemon leaves the cluster).
func (q *Queue) releaseAll() {
	q.mu.Lock()
	held := make([]*lease, 0, len(q.held))
	for l := range q.held {
		held = append(held, l)
	}
	q.mu.Unlock()
	for _, l := range held {
		l.Release(0)
	}
}
