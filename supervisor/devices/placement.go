package devices

import (
	"context"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/jobs"
)

// readTimeout bounds one device memory read while placing a job.
const readTimeout = 2 * time.Second

// Placement returns the job queue's view of lanes: their health (health, the lanes'
// watchdogs; nil for a lane without one), the free device memory of each GPU lane read from
// the driver by the PCI bus id the probe found (none on the cpu), counting what the lane's kept
// workers hold (kept; nil: none) as free since the lane kills them when a stage needs it, and
// the memory a job needs: minNeed bytes besides its gpu_memory_preservation_gb.
func Placement(p *Prober, lanes []string, health func(lane string) jobs.LaneHealth, kept func(lane string) uint64, minNeed uint64) jobs.Placement {
	readers, total := map[string]Reader{}, map[string]uint64{}
	for _, name := range lanes {
		lane, err := ParseLane(name)
		if err != nil || !lane.GPU() {
			continue
		}
		d := p.Device(name)
		if d.GetPciBusId() == "" || d.GetTotalMemoryBytes() == 0 {
			continue
		}
		r, err := MemoryReader(lane, d)
		if err != nil {
			continue
		}
		readers[name], total[name] = r, d.GetTotalMemoryBytes()
	}
	return jobs.Placement{
		Health: health,
		FreeBytes: func(lane string) (uint64, bool) {
			r := readers[lane]
			if r == nil {
				return 0, false
			}
			ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
			defer cancel()
			used, err := r.Used(ctx)
			if err != nil {
				return 0, false
			}
			free := total[lane] - min(used, total[lane])
			if kept != nil {
				free = min(free+kept(lane), total[lane])
			}
			return free, true
		},
		TotalBytes: func(lane string) (uint64, bool) {
			t, ok := total[lane]
			return t, ok
		},
		NeedBytes: func(spec *framepackv1.JobSpec) uint64 {
			return minNeed + uint64(float64(spec.GetGpuMemoryPreservationGb())*(1<<30))
		},
	}
}
