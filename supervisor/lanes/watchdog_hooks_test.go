package lanes_test

import (
	"errors"
	"testing"

	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/supervisor/lanes"
)

// TestWatchdogHooks: Attach sees the worker while it lives and is detached before teardown;
// the attempt's override (workerkit.Override) reaches the LoadRequest the worker gets (a lower
// cap does, a higher one than the lane's does not).
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

	for _, tc := range []struct{ load, want uint64 }{{0, 1 << 30}, {1 << 20, 1 << 20}, {2 << 30, 1 << 30}} {
		st = stage(lanes.VAE, "ok")
		st.MemoryCap = 1 << 30
		st.Load = workerkit.Override{MemoryCap: tc.load, Backend: "cpu"}
		rep, err := l.Run(t.Context(), st)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Loaded == nil || rep.Loaded.DeviceAllocatedBytes != tc.want {
			t.Errorf("attempt cap %d: the worker was loaded with %+v, want cap %d", tc.load, rep.Loaded, tc.want)
		}
	}
	noChildren(t)
}

// TestMemoryCap: a job's cap is the device memory less its preservation and the reserve; none
// without a known device memory; an error when nothing is left.
func TestMemoryCap(t *testing.T) {
	l := newLane(t, func(c *lanes.Config) { c.DeviceMemory = 24 << 30 })
	if got, err := l.MemoryCap(6 << 30); err != nil || got != 24<<30-6<<30-lanes.DefaultReserve {
		t.Fatalf("cap %d, %v", got, err)
	}
	if _, err := l.MemoryCap(23 << 30); !errors.Is(err, lanes.ErrNoMemoryLeft) {
		t.Fatalf("23 of 24 GiB preserved: %v", err)
	}
	if got, err := newLane(t, nil).MemoryCap(6 << 30); err != nil || got != 0 {
		t.Fatalf("unknown device memory: cap %d, %v", got, err)
	}
}
