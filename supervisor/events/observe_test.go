package events_test

import (
	"testing"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/events"
)

// TestObserve checks that the observer sees every published event, ephemeral ones included,
// in order, and none that Publish refused.
func TestObserve(t *testing.T) {
	st := newMemStore("j1")
	var seen []string
	var h *events.Hub
	var err error
	h, err = events.New(events.Config{Persist: st.persist, Load: st.load, Observe: func(ev *framepackv1.JobEvent) {
		// Observe runs without the hub's lock: calling back into the hub must not deadlock.
		_ = h.Watchers(ev.GetJobId())
		seen = append(seen, kind(ev))
	}})
	if err != nil {
		t.Fatal(err)
	}
	pub := []*framepackv1.JobEvent{
		{JobId: "j1", Event: &framepackv1.JobEvent_StageStarted{StageStarted: &framepackv1.StageStarted{Stage: framepackv1.Stage_STAGE_TRANSFORMER}}},
		{JobId: "j1", Event: &framepackv1.JobEvent_Preview{Preview: &framepackv1.Preview{Step: 1}}},
		{JobId: "j1", Event: &framepackv1.JobEvent_SamplingStep{SamplingStep: &framepackv1.SamplingStep{Step: 1}}},
		{JobId: "j1", Event: &framepackv1.JobEvent_JobFinished{JobFinished: &framepackv1.JobFinished{}}},
	}
	for _, ev := range pub {
		if err := h.Publish(ev); err != nil {
			t.Fatal(err)
		}
	}
	// Refused: after the terminal event, and for an unknown job.
	_ = h.Publish(&framepackv1.JobEvent{JobId: "j1", Event: &framepackv1.JobEvent_SamplingStep{SamplingStep: &framepackv1.SamplingStep{}}})
	_ = h.Publish(&framepackv1.JobEvent{JobId: "nope", Event: &framepackv1.JobEvent_SamplingStep{SamplingStep: &framepackv1.SamplingStep{}}})
	want := []string{"stage_started", "preview", "sampling_step", "job_finished"}
	if len(seen) != len(want) {
		t.Fatalf("observed %v, want %v", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("observed %v, want %v", seen, want)
		}
	}
}

func kind(ev *framepackv1.JobEvent) string {
	switch ev.GetEvent().(type) {
	case *framepackv1.JobEvent_StageStarted:
		return "stage_started"
	case *framepackv1.JobEvent_Preview:
		return "preview"
	case *framepackv1.JobEvent_SamplingStep:
		return "sampling_step"
	case *framepackv1.JobEvent_JobFinished:
		return "job_finished"
	}
	return "other"
}
