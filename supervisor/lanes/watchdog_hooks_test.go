package lanes_test

import (
	"errors"
	"testing"

	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/supervisor/lanes"
)

// TestWatchdogHooks: Attach sees the worker while it lives and is detached before teardown;
// PrepareLoad changes the LoadRequest the worker gets.
func TestWatchdogHooks(t *testing.T) {
	l := newLane(t, nil)
	st := stage(lanes.VAE, "ok")
	var attached, detachedAlive int
	st.Attach = func(p lanes.Proc) func() {
		attached = p.PID()
		return func() {
			if alive(p.PID()) {
				detachedAlive = p.PID()
			}
		}
	}
	rep, err := l.Run(t.Context(), st)
	if err != nil {
		t.Fatal(err)
	}
	if attached == 0 || attached != rep.PID || detachedAlive != rep.PID {
		t.Fatalf("attached %d, detached while alive %d, worker %d", attached, detachedAlive, rep.PID)
	}
	if alive(rep.PID) {
		t.Fatalf("worker %d alive after its stage", rep.PID)
	}

	st = stage(lanes.VAE, "ok")
	st.PrepareLoad = func(req *workerkit.LoadRequest) { req.ModelDir = "bad" } // the fake worker refuses "bad"
	_, err = l.Run(t.Context(), st)
	var we *workerkit.Error
	if !errors.As(err, &we) || we.Code != workerkit.CodeInvalidArgument {
		t.Fatalf("PrepareLoad not applied: %v", err)
	}
	noChildren(t)
}
