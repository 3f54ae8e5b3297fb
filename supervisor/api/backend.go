package api

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/events"
	"github.com/framepackd/framepackd/supervisor/jobs"
)

// Store is what the API reads and deletes jobs in: the single host's jobs.Store (through
// LocalStore), or a cluster's shared store (supervisor/cluster).
type Store interface {
	// Get returns a job; an error wrapping jobs.ErrNotFound when it is unknown.
	Get(id string) (*framepackv1.Job, error)
	// List returns a page of jobs, newest first (jobs.Store.List).
	List(opts jobs.ListOptions) ([]*framepackv1.Job, string, error)
	// JobForRequest returns the job a client request id created (jobs.Store.JobForRequest).
	JobForRequest(req jobs.ClientRequest) (*framepackv1.Job, error)
	// Delete removes a finished job and its files and returns the bytes freed.
	Delete(id string) (int64, error)
	// PendingBytes and UsedBytes are the disk budget's figures (jobs.Store).
	PendingBytes() (int64, error)
	UsedBytes() (int64, error)
	// StateDir is this daemon's state directory (its free space is checked at submit).
	StateDir() string
	// JobDir is a job's directory on this daemon.
	JobDir(id string) jobs.Dir
	// OpenVideo opens video path of job id for reading (GetArtifact): path is
	// JobResult.video_path or JobProgress.latest_video_path, which must name a file of the
	// job. An error wrapping os.ErrNotExist when the file is gone.
	OpenVideo(id, path string) (*os.File, error)
	// Sweep deletes the finished jobs the retention policy does not keep.
	Sweep(r jobs.Retention) ([]string, error)
	// Close releases the store.
	Close() error
}

// Events is where job events are published and watched: the single host's events.Hub, or a
// cluster's event streams (supervisor/cluster).
type Events interface {
	// Publish hands one event to the job's watchers (events.Hub.Publish).
	Publish(ev *framepackv1.JobEvent) error
	// Watch returns a job's history so far and a stream of its later events
	// (events.Hub.Subscribe); an error wrapping jobs.ErrNotFound for an unknown job.
	Watch(id string, opts events.SubscribeOptions) ([]*framepackv1.JobEvent, events.Stream, error)
	// Close ends every stream with events.ErrClosed.
	Close()
}

// Cluster is what makes a daemon one of a cluster's (supervisor/cluster): its store, shared
// queue and event streams replace the state directory's bbolt store and the in-process hub.
type Cluster interface {
	// Store keeps the cluster's jobs; the queue runs them through it too.
	Store() ClusterStore
	// Queue is the cluster's shared job queue.
	Queue() jobs.SharedQueue
	// Events carries every daemon's job events to every watcher.
	Events() Events
}

// ClusterStore is a cluster's store: what the API reads and what the queue runs jobs with.
type ClusterStore interface {
	Store
	jobs.Backend
}

// LocalStore is the single host's jobs.Store as the API uses it.
type LocalStore struct{ *jobs.Store }

// OpenVideo opens a video of the job's directory.
func (s LocalStore) OpenVideo(id, path string) (*os.File, error) {
	if err := InsideJobDir(s.JobDir(id), path); err != nil {
		return nil, err
	}
	return os.Open(path)
}

// InsideJobDir checks that path lies inside a job directory.
func InsideJobDir(dir jobs.Dir, path string) error {
	rel, err := filepath.Rel(dir.Path(), path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return fmt.Errorf("video %s is outside the job directory", path)
	}
	return nil
}
