package watchdog

import (
	"context"
	"fmt"
	"sync"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// LaneState says whether a lane takes new GPU stages.
type LaneState int

// Lane states (framepack.v1.LaneState).
const (
	// LaneHealthy takes work.
	LaneHealthy LaneState = iota
	// LaneDegraded failed a device probe; it backs off and probes again, and takes work once
	// a probe passes.
	LaneDegraded
	// LaneHeld saw device memory not come back after a worker exited; it takes no work until
	// the memory returns (a monitor polls it) or an operator releases it.
	LaneHeld
)

// String names the state.
func (s LaneState) String() string {
	switch s {
	case LaneHealthy:
		return "healthy"
	case LaneDegraded:
		return "degraded"
	case LaneHeld:
		return "held"
	}
	return fmt.Sprintf("lane_state(%d)", int(s))
}

// Proto returns the state as the public API's LaneState.
func (s LaneState) Proto() framepackv1.LaneState {
	switch s {
	case LaneHealthy:
		return framepackv1.LaneState_LANE_STATE_HEALTHY
	case LaneDegraded:
		return framepackv1.LaneState_LANE_STATE_DEGRADED
	case LaneHeld:
		return framepackv1.LaneState_LANE_STATE_HELD
	}
	return framepackv1.LaneState_LANE_STATE_UNSPECIFIED
}

// LaneStatus is a lane's health as ListDevices shows it.
type LaneStatus struct {
	Lane  string
	State LaneState
	// Reason says why the lane is degraded or held; empty when healthy.
	Reason string
	// Since is when the lane entered State.
	Since time.Time
	// NextProbe is when a degraded lane probes its device again.
	NextProbe time.Time
	// Holds and Degrades count the times the lane was held and degraded.
	Holds, Degrades int
}

// Health is one lane's health state. It is safe for concurrent use; Wait lets a stage runner
// block while the lane is not healthy.
type Health struct {
	now func() time.Time

	// mu protects st and changed.
	mu      sync.Mutex
	st      LaneStatus
	changed chan struct{} // closed and replaced at every change
}

// NewHealth returns the health of lane, healthy.
func NewHealth(lane string) *Health {
	return &Health{now: time.Now, st: LaneStatus{Lane: lane, State: LaneHealthy, Since: time.Now()},
		changed: make(chan struct{})}
}

// Status returns the lane's status now.
func (h *Health) Status() LaneStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.st
}

// Changed returns a channel closed at the next change of state.
func (h *Health) Changed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

func (h *Health) set(state LaneState, reason string, next time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if state != h.st.State {
		h.st.Since = h.now()
		switch state {
		case LaneHeld:
			h.st.Holds++
		case LaneDegraded:
			h.st.Degrades++
		}
	}
	h.st.State, h.st.Reason, h.st.NextProbe = state, reason, next
	close(h.changed)
	h.changed = make(chan struct{})
}

// Degrade marks the lane degraded for reason, with its next probe at next.
func (h *Health) Degrade(reason string, next time.Time) { h.set(LaneDegraded, reason, next) }

// Hold marks the lane held for reason.
func (h *Health) Hold(reason string) { h.set(LaneHeld, reason, time.Time{}) }

// MarkHealthy makes the lane take work again (a probe passed, memory came back).
func (h *Health) MarkHealthy() { h.set(LaneHealthy, "", time.Time{}) }

// Release is the operator's override: a held or degraded lane takes work again.
func (h *Health) Release() { h.MarkHealthy() }

// Wait blocks until the lane is healthy or ctx ends.
func (h *Health) Wait(ctx context.Context) error {
	for {
		h.mu.Lock()
		state, ch := h.st.State, h.changed
		h.mu.Unlock()
		if state == LaneHealthy {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for lane %s: %w", h.st.Lane, context.Cause(ctx))
		case <-ch:
		}
	}
}

// Annotate sets a ListDevices entry's lane state and reason from the lane's health.
func (h *Health) Annotate(d *framepackv1.Device) {
	st := h.Status()
	d.LaneState = st.State.Proto()
	d.LaneStateReason = st.Reason
	if st.State == LaneDegraded && !st.NextProbe.IsZero() {
		d.LaneStateReason += fmt.Sprintf(" (next probe at %s)", st.NextProbe.UTC().Format(time.RFC3339))
	}
}
