package jobs

import (
	"testing"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestApplyProgress(t *testing.T) {
	p := &framepackv1.JobProgress{}
	step := func(section, i, n uint32) *framepackv1.JobEvent {
		return &framepackv1.JobEvent{Event: &framepackv1.JobEvent_SamplingStep{SamplingStep: &framepackv1.SamplingStep{
			SectionIndex: section, Step: i, TotalSteps: n, Eta: durationpb.New(time.Minute)}}}
	}
	started := func(s framepackv1.Stage, section uint32) *framepackv1.JobEvent {
		return &framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageStarted{StageStarted: &framepackv1.StageStarted{Stage: s, SectionIndex: section}}}
	}
	for i, tc := range []struct {
		ev       *framepackv1.JobEvent
		stage    framepackv1.Stage
		section  uint32
		step     uint32
		fraction float32
	}{
		{started(framepackv1.Stage_STAGE_TEXT_ENCODE, 7), framepackv1.Stage_STAGE_TEXT_ENCODE, 0, 0, 0},
		{started(framepackv1.Stage_STAGE_TRANSFORMER, 0), framepackv1.Stage_STAGE_TRANSFORMER, 0, 0, 0},
		{step(0, 5, 10), framepackv1.Stage_STAGE_TRANSFORMER, 0, 5, 0.125},
		{&framepackv1.JobEvent{Event: &framepackv1.JobEvent_SectionVideo{SectionVideo: &framepackv1.SectionVideo{SectionIndex: 0, Path: "/v/0.mp4"}}},
			framepackv1.Stage_STAGE_TRANSFORMER, 0, 5, 0.25},
		{started(framepackv1.Stage_STAGE_TRANSFORMER, 1), framepackv1.Stage_STAGE_TRANSFORMER, 1, 0, 0.25},
		{step(1, 10, 10), framepackv1.Stage_STAGE_TRANSFORMER, 1, 10, 0.5},
		{step(1, 1, 10), framepackv1.Stage_STAGE_TRANSFORMER, 1, 1, 0.5}, // a retry never moves the bar back
	} {
		applyProgress(p, tc.ev, 4)
		if p.GetStage() != tc.stage || p.GetSectionIndex() != tc.section || p.GetStep() != tc.step || p.GetFraction() != tc.fraction {
			t.Fatalf("event %d: progress %v, want stage %v section %d step %d fraction %g", i, p, tc.stage, tc.section, tc.step, tc.fraction)
		}
	}
	if p.GetLatestVideoPath() != "/v/0.mp4" || p.GetEta().AsDuration() != time.Minute || p.GetTotalSteps() != 10 {
		t.Fatalf("progress %v", p)
	}
}
