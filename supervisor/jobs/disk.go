package jobs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
)

// ErrNotFinished is returned by Delete for a job that is still queued or running.
var ErrNotFinished = errors.New("jobs: job has not finished")

// Finished reports whether state is terminal (succeeded, failed or cancelled).
func Finished(state framepackv1.JobState) bool {
	switch state {
	case framepackv1.JobState_JOB_STATE_SUCCEEDED, framepackv1.JobState_JOB_STATE_FAILED, framepackv1.JobState_JOB_STATE_CANCELLED:
		return true
	}
	return false
}

// Delete removes finished job id: its record, resume point and event log, then its
// directory with the input and the videos. A queued or running job is ErrNotFinished (cancel
// it first). It returns the bytes the directory held.
func (s *Store) Delete(id string) (int64, error) {
	err := s.db.Update(func(tx *bolt.Tx) error {
		job, err := getJob(tx, id)
		if err != nil {
			return err
		}
		if !Finished(job.GetState()) {
			return fmt.Errorf("%w: it is %s; cancel it first", ErrNotFinished, stateWord(job.GetState()))
		}
		m, err := getMeta(tx, id)
		if err != nil {
			return err
		}
		if err := tx.Bucket(bucketOrder).Delete(seqKey(m.Seq)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketMeta).Delete([]byte(id)); err != nil {
			return err
		}
		if m.Request.ID != "" {
			if err := tx.Bucket(bucketRequests).Delete([]byte(m.Request.ID)); err != nil {
				return err
			}
		}
		if err := tx.Bucket(bucketJobs).Delete([]byte(id)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketEvents).DeleteBucket([]byte(id)); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
			return err
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("delete job %s: %w", id, err)
	}
	// The record is gone first: a crash now leaves an orphan directory, which Open removes.
	dir := s.JobDir(id).Path()
	n, _ := DirBytes(dir)
	if err := os.RemoveAll(dir); err != nil {
		return 0, fmt.Errorf("delete job %s: %w", id, err)
	}
	return n, nil
}

func stateWord(st framepackv1.JobState) string {
	switch st {
	case framepackv1.JobState_JOB_STATE_QUEUED:
		return "queued"
	case framepackv1.JobState_JOB_STATE_RUNNING:
		return "running"
	}
	return st.String()
}

// DirBytes returns the bytes of the regular files under dir (0 for a missing dir).
func DirBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n, err
}

// UsedBytes returns the bytes of every job directory (inputs, checkpoints, videos).
func (s *Store) UsedBytes() (int64, error) {
	return DirBytes(filepath.Join(s.dir, JobsDirName))
}

// Retention says which finished jobs the daemon deletes on its own. Zero fields keep
// everything.
type Retention struct {
	// MaxAge deletes finished jobs last updated longer ago than this.
	MaxAge time.Duration
	// MaxBytes deletes the oldest finished jobs until the job directories together hold at
	// most this many bytes (queued and running jobs count but are never deleted).
	MaxBytes int64
}

// Enabled reports whether r deletes anything.
func (r Retention) Enabled() bool { return r.MaxAge > 0 || r.MaxBytes > 0 }

// Sweep deletes the finished jobs that r does not keep, oldest first, and returns their ids.
func (s *Store) Sweep(r Retention) ([]string, error) {
	if !r.Enabled() {
		return nil, nil
	}
	var entries []RetentionEntry
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketJobs).ForEach(func(k, _ []byte) error {
			job, err := getJob(tx, string(k))
			if err != nil {
				return err
			}
			entries = append(entries, RetentionEntry{ID: job.GetId(), Updated: job.GetUpdateTime().AsTime(), Finished: Finished(job.GetState())})
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("retention sweep: %w", err)
	}
	for i := range entries {
		entries[i].Bytes, _ = DirBytes(s.JobDir(entries[i].ID).Path())
	}
	var removed []string
	var errs []error
	for _, id := range r.Victims(entries, s.now()) {
		if _, err := s.Delete(id); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}

// RetentionEntry is one job as a retention policy weighs it.
type RetentionEntry struct {
	ID       string
	Updated  time.Time // when the job last changed
	Bytes    int64     // what its files hold
	Finished bool      // only finished jobs are deleted
}

// Victims returns the finished jobs of entries that r does not keep at time now, oldest first:
// those older than MaxAge, then the oldest until all jobs together hold at most MaxBytes.
func (r Retention) Victims(entries []RetentionEntry, now time.Time) []string {
	all := slices.Clone(entries)
	var total int64
	for _, e := range all {
		total += e.Bytes
	}
	slices.SortFunc(all, func(a, b RetentionEntry) int { return a.Updated.Compare(b.Updated) })
	var out []string
	for _, e := range all {
		if !e.Finished {
			continue
		}
		tooOld := r.MaxAge > 0 && now.Sub(e.Updated) > r.MaxAge
		tooBig := r.MaxBytes > 0 && total > r.MaxBytes
		if !tooOld && !tooBig {
			continue
		}
		total -= e.Bytes
		out = append(out, e.ID)
	}
	return out
}

// EstimateBytes is about the most disk a job of spec (defaults filled in or not) holds at
// once: its checkpoint (history pixels as float32, the bulk, plus the latents) and its video,
// each twice, because the next one is written before the previous one is removed. The frame
// size is the largest of the spec's buckets, or resolution² for a server table.
func EstimateBytes(spec *framepackv1.JobSpec) int64 {
	s := WithDefaults(spec)
	area := int64(s.GetResolution()) * int64(s.GetResolution())
	for _, b := range s.GetBuckets() {
		area = max(area, int64(b.GetHeight())*int64(b.GetWidth()))
	}
	frames := int64(plan.TotalSections(s))*int64(s.GetLatentWindowSize())*4 + 1
	pixels := frames * area * 3 * 4                   // float32 RGB history
	latents := (frames/4 + 20) * 16 * (area / 64) * 4 // float32, 16 channels at 1/8 size
	video := frames * area / 2                        // H.264 at high quality: under 4 bits a pixel
	return 2*(pixels+latents) + 2*video + 1<<20       // + spec, events, conditioning slack
}

// PendingBytes is what the unfinished (queued or running) jobs will still write: their
// EstimateBytes less what their directories hold already.
func (s *Store) PendingBytes() (int64, error) {
	unfinished, err := s.Unfinished()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, job := range unfinished {
		have, _ := DirBytes(s.JobDir(job.GetId()).Path())
		n += max(0, EstimateBytes(job.GetSpec())-have)
	}
	return n, nil
}
