package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
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

// TestDiskErrorWords: a write that fails for lack of space (ENOSPC from a file, or ffmpeg's
// "No space left on device") is reported as ErrDiskFull, in the user's words; other errors are
// left alone.
func TestDiskErrorWords(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("save history: write x: %w", syscall.ENOSPC),
		errors.New("write mp4 v.mp4: ffmpeg: exit status 1: av_interleaved_write_frame(): No space left on device"),
	} {
		if got := diskError(err); !errors.Is(got, ErrDiskFull) || !strings.HasPrefix(got.Error(), "disk full: ") {
			t.Errorf("%v: got %v", err, got)
		}
	}
	other := errors.New("frames: bad shape")
	if got := diskError(other); got != other {
		t.Errorf("other error changed: %v", got)
	}
}
