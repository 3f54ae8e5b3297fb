package jobs

import (
	"fmt"
	"slices"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// DefaultRecheck is how often the queue looks again at lanes that refused a job for lack of
// device memory (Placement.Recheck's default): memory held by other processes gives no signal
// when it is freed.
const DefaultRecheck = 2 * time.Second

// LaneHealth is a lane's readiness as the watchdog keeps it (*watchdog.Health implements it).
type LaneHealth interface {
	// Ready says whether the lane takes work now, and why not: a held lane (device memory
	// not back after a worker) or a degraded one (failed a device probe) does not.
	Ready() (ok bool, reason string)
	// Changed returns a channel closed at the lane's next change of state.
	Changed() <-chan struct{}
}

// Placement is what the queue needs to choose a lane for a job on a host with several devices.
// The zero value places every job on the first free lane in Config.Lanes order (each lane
// healthy, memory unchecked).
//
// The rule: jobs are taken in submission order; a job pinned to a lane (JobSpec.lane) waits
// for that lane, and the jobs pinned to one lane start in submission order; an unpinned job
// goes to the least-loaded lane that is free, ready and has the memory — the lane with the
// most free device memory, Config.Lanes order on a tie. A lane that is held, degraded or
// short of memory is passed over and blocks no other lane; a job no free lane can take stays
// queued and does not hold back a later job that another lane can take.
type Placement struct {
	// Health returns a lane's health; nil, or a nil result, means always ready.
	Health func(lane string) LaneHealth
	// FreeBytes returns the device memory free on lane now; ok false means unknown (no
	// memory check on that lane, e.g. the cpu).
	FreeBytes func(lane string) (free uint64, ok bool)
	// TotalBytes returns a lane's device memory; ok false means unknown. A job that needs
	// more than every lane it may run on has fails at once instead of waiting forever.
	TotalBytes func(lane string) (total uint64, ok bool)
	// NeedBytes returns the free device memory a job needs on its lane (its
	// gpu_memory_preservation_gb plus the pipeline's minimum); nil or 0 means no check.
	NeedBytes func(spec *framepackv1.JobSpec) uint64
	// Recheck is how often lanes that refused a job for memory are looked at again; 0 means
	// DefaultRecheck.
	Recheck time.Duration
}

// laneCandidate is a free lane as one scheduling pass sees it.
type laneCandidate struct {
	name      string
	free      uint64
	freeKnown bool
}

// placement is one scheduling pass's view of the free lanes. Loop goroutine only.
type placement struct {
	q     *Queue
	st    *loopState
	free  []laneCandidate
	short bool // a job was refused for memory: look again after Recheck
}

// freeLanes returns the lanes with no running job that are ready, and arranges a wake-up for
// those that are not. Loop goroutine only.
func (q *Queue) freeLanes(st *loopState) *placement {
	p := &placement{q: q, st: st}
	for _, lane := range q.cfg.Lanes {
		if st.byLane[lane] != nil {
			continue
		}
		if h := q.laneHealth(lane); h != nil {
			if ok, reason := h.Ready(); !ok {
				q.watchLane(st, lane, h, reason)
				continue
			}
		}
		c := laneCandidate{name: lane}
		if q.cfg.Placement.FreeBytes != nil {
			c.free, c.freeKnown = q.cfg.Placement.FreeBytes(lane)
		}
		p.free = append(p.free, c)
	}
	return p
}

func (q *Queue) laneHealth(lane string) LaneHealth {
	if q.cfg.Placement.Health == nil {
		return nil
	}
	return q.cfg.Placement.Health(lane)
}

// watchLane wakes the loop at the next change of a lane that is not ready (once per lane
// until it fires). Loop goroutine only.
func (q *Queue) watchLane(st *loopState, lane string, h LaneHealth, reason string) {
	if st.watched == nil {
		st.watched = map[string]bool{}
	}
	if st.watched[lane] {
		return
	}
	st.watched[lane] = true
	q.log.WithField("lane", lane).WithField("reason", reason).Info("lane not ready: jobs go to other lanes until it is")
	ch := h.Changed()
	go func() {
		select {
		case <-ch:
			select {
			case q.wakeCh <- lane:
			case <-q.stopped:
			}
		case <-q.stopped:
		}
	}()
}

// need returns the memory job needs (0: no check).
func (p *placement) need(job pendingJob) uint64 {
	if job.spec == nil || p.q.cfg.Placement.NeedBytes == nil {
		return 0
	}
	return p.q.cfg.Placement.NeedBytes(job.spec)
}

// neverFits returns why job can run on no lane, however long it waits: it needs more memory
// than every lane it may run on has in total. Empty when some lane may take it.
func (q *Queue) neverFits(job pendingJob, need uint64) string {
	if need == 0 || q.cfg.Placement.TotalBytes == nil {
		return ""
	}
	var largest uint64
	for _, lane := range q.cfg.Lanes {
		if job.lane != "" && job.lane != lane {
			continue
		}
		total, ok := q.cfg.Placement.TotalBytes(lane)
		if !ok || total >= need {
			return ""
		}
		largest = max(largest, total)
	}
	return fmt.Sprintf("the job needs %.1f GiB of free device memory (gpu_memory_preservation_gb and the server's minimum) "+
		"but the largest lane it may run on has %.1f GiB: lower gpu_memory_preservation_gb", float64(need)/(1<<30), float64(largest)/(1<<30))
}

// pick takes the lane job should start on now out of the free lanes; ok is false when no free
// lane can take it.
func (p *placement) pick(job pendingJob) (c laneCandidate, ok bool) {
	need := p.need(job)
	best := -1
	for i, c := range p.free {
		if job.lane != "" && job.lane != c.name {
			continue
		}
		if need > 0 && c.freeKnown && c.free < need {
			p.short = true
			continue
		}
		if best < 0 || (c.freeKnown && (!p.free[best].freeKnown || c.free > p.free[best].free)) {
			best = i
		}
	}
	if best < 0 {
		return laneCandidate{}, false
	}
	c = p.free[best]
	p.free = slices.Delete(p.free, best, best+1)
	return c, true
}
