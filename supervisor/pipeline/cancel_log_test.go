package pipeline

import (
	"context"
	"errors"
	"testing"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/jobs"
)

// TestCancelledStageLoggedAtInfo: a stage stopped by the user's cancel is logged at info as
// "stage cancelled", not as a failed stage at warning level; a real failure still warns.
func TestCancelledStageLoggedAtInfo(t *testing.T) {
	log, hook := logtest.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	j := &jobRun{r: &Runner{cfg: Config{}}, job: &jobs.Job{ID: "j", Dir: jobs.Dir(t.TempDir())}, log: log,
		emitf: func(*framepackv1.JobEvent) {}}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_ = j.hostStage(ctx, framepackv1.Stage_STAGE_PREPARE, -1, func() error { return ctx.Err() })
	for _, e := range hook.AllEntries() {
		if e.Level <= logrus.WarnLevel {
			t.Errorf("cancel logged at %s: %s %v", e.Level, e.Message, e.Data)
		}
	}
	if e := hook.LastEntry(); e == nil || e.Message != "stage cancelled" || e.Level != logrus.InfoLevel {
		t.Fatalf("last entry %+v", e)
	}
	hook.Reset()
	_ = j.hostStage(t.Context(), framepackv1.Stage_STAGE_PREPARE, -1, func() error { return errors.New("boom") })
	if e := hook.LastEntry(); e == nil || e.Message != "stage failed" || e.Level != logrus.WarnLevel {
		t.Fatalf("failure entry %+v", e)
	}
}
