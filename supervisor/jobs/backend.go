package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// Backend is where a Queue keeps its jobs: the single host's Store (bbolt and the state
// directory), or a cluster's shared store (supervisor/cluster). *Store implements it.
type Backend interface {
	// Create stores a new job in JOB_STATE_QUEUED (Store.Create).
	Create(spec *framepackv1.JobSpec, image []byte) (*framepackv1.Job, error)
	// CreateOnce is Create for a submission with a client request id (Store.CreateOnce).
	CreateOnce(req ClientRequest, spec *framepackv1.JobSpec, image []byte) (*framepackv1.Job, bool, error)
	// Get returns a job; ErrNotFound when it is unknown.
	Get(id string) (*framepackv1.Job, error)
	// Update changes a job in one transaction (Store.Update).
	Update(id string, fn func(*framepackv1.Job) error) (*framepackv1.Job, error)
	// Unfinished returns the queued and running jobs, oldest first.
	Unfinished() ([]*framepackv1.Job, error)
	// Prepare readies job id to run on this daemon and returns what its Runner needs.
	Prepare(id string) (Prepared, error)
	// Checkpoint returns a job's resume point, nil when no section has finished.
	Checkpoint(id string) (*Checkpoint, error)
	// SaveCheckpoint records a job's resume point (Store.SaveCheckpoint).
	SaveCheckpoint(id string, cp Checkpoint) error
	// RemovePartials removes what an interrupted writer left in a job's directory.
	RemovePartials(id string) ([]string, error)
}

// Prepared is a job made ready to run on this daemon: its files on the local disk and where
// it resumes.
type Prepared struct {
	// Dir is the job's directory on this daemon.
	Dir Dir
	// InputPath and EndImagePath are the submitted images (EndImagePath "" without one;
	// InputPath "" for a job that extends a video).
	InputPath, EndImagePath string
	// KeyframePaths are the keyframe images (JobSpec.keyframes' order); VideoPath the input
	// video of a job that extends one, "" else.
	KeyframePaths []string
	VideoPath     string
	// Resume is the job's last checkpoint, its files in Dir; nil to start from scratch.
	Resume *Checkpoint
	// FirstStart is when the job first started anywhere (JobResult.duration counts from it).
	FirstStart time.Time
}

// Prepare records the job's first start and returns its files and resume point. An
// unreadable checkpoint is logged by the caller and the job starts from scratch.
func (s *Store) Prepare(id string) (Prepared, error) {
	first, err := s.markStarted(id)
	if err != nil {
		return Prepared{}, err
	}
	input, err := s.InputPath(id)
	if err != nil {
		return Prepared{}, err
	}
	end, err := s.EndImagePath(id)
	if err != nil {
		return Prepared{}, err
	}
	keyframes, video, err := s.ExtraInputs(id)
	if err != nil {
		return Prepared{}, err
	}
	cp, err := s.Checkpoint(id)
	if err != nil {
		return Prepared{}, err
	}
	return Prepared{Dir: s.JobDir(id), InputPath: input, EndImagePath: end, KeyframePaths: keyframes, VideoPath: video,
		Resume: cp, FirstStart: first}, nil
}

var _ Backend = (*Store)(nil)

// ErrLeaseLost is returned by a cluster's Backend for a write by a daemon whose job another
// daemon has taken over (or that was cancelled elsewhere): the write is refused and the
// daemon stops the job without recording anything.
var ErrLeaseLost = errors.New("jobs: job taken over by another daemon")

// SharedQueue is a queue of jobs shared by several daemons (supervisor/cluster): a submission
// is put into it through any daemon, and each daemon takes jobs from it when one of its lanes
// is free. Nil on a single host, where the Queue keeps its pending jobs itself.
type SharedQueue interface {
	// Put queues stored job id for whichever daemon takes it.
	Put(ctx context.Context, id string) error
	// Take waits (a few seconds at most, or until ctx ends) for a job to run and returns its
	// id and this daemon's lease on it; "" and nil when none came. A job that was taken by a
	// daemon that died, or was given back, is taken again (redelivered) the same way.
	Take(ctx context.Context) (string, Lease, error)
}

// Lease is a daemon's hold on a job taken from a SharedQueue; while it holds the lease no
// other daemon runs the job.
type Lease interface {
	// Lost is closed when the job is no longer this daemon's: another daemon took it over
	// (this one was presumed dead), or it was cancelled through another daemon.
	Lost() <-chan struct{}
	// Done removes the job from the shared queue: it ended (finished, failed, cancelled).
	Done()
	// Release gives the job back to the shared queue, for any daemon to take after delay.
	Release(delay time.Duration)
}

// releaseDelay is how long a job that no lane of this daemon can take now is kept from
// being taken again (by any daemon), so that the queue does not spin on it.
const releaseDelay = 2 * time.Second

// taken is a job a SharedQueue handed to the loop.
type taken struct {
	id    string
	lease Lease
}

// take runs while the queue does: it takes a job from the shared queue whenever the loop wants
// one (its free lanes outnumber its pending jobs) and hands it to the loop.
func (q *Queue) take(ctx context.Context) {
	want := 0
	for {
		if want <= 0 {
			select {
			case want = <-q.wantCh:
				continue
			case <-ctx.Done():
				return
			case <-q.stopped:
				return
			}
		}
		select { // the newest want wins
		case want = <-q.wantCh:
			if want <= 0 {
				continue
			}
		default:
		}
		id, lease, err := q.cfg.Shared.Take(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			q.log.WithError(err).Warn("take a job from the cluster's queue")
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return
			}
			continue
		}
		if lease == nil {
			continue
		}
		select {
		case q.takenCh <- taken{id: id, lease: lease}:
			want--
		case <-ctx.Done():
			lease.Release(0)
			return
		case <-q.stopped:
			lease.Release(0)
			return
		}
	}
}

// wantMore tells the taker how many jobs the loop can start now. Loop goroutine only.
func (q *Queue) wantMore(st *loopState, free int) {
	if q.cfg.Shared == nil || st.drain {
		return
	}
	n := free - len(st.pending)
	if n == st.wanted {
		return
	}
	select {
	case <-q.wantCh: // drop a want the taker has not read
	default:
	}
	q.wantCh <- n
	st.wanted = n
}

// watchLease reports to the loop when a running job's lease is lost.
func (q *Queue) watchLease(r *run) {
	if r.lease == nil {
		return
	}
	select {
	case <-r.lease.Lost():
		select {
		case q.lostCh <- r:
		case <-q.stopped:
		}
	case <-r.ctx.Done():
	}
}

// handleLost stops a run whose lease is lost: nothing is recorded, the daemon that took the
// job over (or the one that cancelled it) does that. Loop goroutine only.
func (q *Queue) handleLost(st *loopState, r *run) {
	if st.runs[r.job.ID] != r {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	job, err := q.cfg.Store.Get(r.job.ID)
	if err == nil && isFinal(job.GetState()) {
		r.ended = true // cancelled through another daemon: the job leaves the shared queue
	}
	r.cancel(fmt.Errorf("%w (job %s)", ErrLeaseLost, r.job.ID))
	q.log.WithFields(map[string]any{"job": r.job.ID, "lane": r.lane}).Warn("job taken over or cancelled through another daemon: stopping it here")
}
