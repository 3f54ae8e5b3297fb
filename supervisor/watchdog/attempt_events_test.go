package watchdog_test

import (
	"syscall"
	"testing"

	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/watchdog"
)

// TestRetriedStageEvents: a stage the watchdog retries says so in the job's events: a
// StageStarted for attempt 1 and another for attempt 2, and its StageFinished carries attempt
// 2, the attempt that succeeded (every event used to say attempt 1).
func TestRetriedStageEvents(t *testing.T) {
	o := newDaemonOpts(t)
	o.plan = func(a watchdog.AttemptInfo) *workerkit.Fault {
		if a.Stage.Kind == framepackv1.Stage_STAGE_VAE_DECODE && a.Stage.Section == 0 && a.Attempt == 1 {
			return &workerkit.Fault{ExitAtOp: 1, ExitSignal: int32(syscall.SIGKILL)}
		}
		return nil
	}
	d, err := startDaemon(o, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer d.stop()
	c := framepackv1.NewJobServiceClient(conn(t, o.Socket))
	id := submit(t, c, demoSpec(1), demoImage(t))
	var started, finished []uint32
	last, err := watch(t.Context(), c, id, func(ev *framepackv1.JobEvent) bool {
		if s := ev.GetStageStarted(); s != nil && s.GetStage() == framepackv1.Stage_STAGE_VAE_DECODE && s.GetSectionIndex() == 0 {
			started = append(started, s.GetAttempt())
		}
		if s := ev.GetStageFinished(); s != nil && s.GetStage() == framepackv1.Stage_STAGE_VAE_DECODE && s.GetSectionIndex() == 0 {
			finished = append(finished, s.GetAttempt())
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if last.GetJobFinished() == nil {
		t.Fatalf("job ended with %v", last)
	}
	if len(started) != 2 || started[0] != 1 || started[1] != 2 {
		t.Errorf("vae decode section 0 StageStarted attempts %v, want [1 2]", started)
	}
	if len(finished) != 1 || finished[0] != 2 {
		t.Errorf("vae decode section 0 StageFinished attempts %v, want [2]", finished)
	}
}
