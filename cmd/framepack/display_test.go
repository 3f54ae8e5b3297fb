package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func jobEvents(t0 time.Time) []*framepackv1.JobEvent {
	at := func(i int) *timestamppb.Timestamp {
		return timestamppb.New(t0.Add(time.Duration(i) * time.Millisecond))
	}
	evs := []*framepackv1.JobEvent{
		{JobId: "j", Time: at(0), Event: &framepackv1.JobEvent_Snapshot{Snapshot: &framepackv1.Job{Id: "j", State: framepackv1.JobState_JOB_STATE_RUNNING,
			Spec: &framepackv1.JobSpec{TotalSecondLength: 2.4, LatentWindowSize: 9, Steps: 4}}}},
		{JobId: "j", Time: at(1), Event: &framepackv1.JobEvent_StageStarted{StageStarted: &framepackv1.StageStarted{Stage: framepackv1.Stage_STAGE_TEXT_ENCODE}}},
		{JobId: "j", Time: at(2), Event: &framepackv1.JobEvent_StageStarted{StageStarted: &framepackv1.StageStarted{Stage: framepackv1.Stage_STAGE_TRANSFORMER}}},
	}
	for i := uint32(1); i <= 4; i++ {
		evs = append(evs, &framepackv1.JobEvent{JobId: "j", Time: at(2 + int(i)), Event: &framepackv1.JobEvent_SamplingStep{SamplingStep: &framepackv1.SamplingStep{
			Step: i, TotalSteps: 4, Eta: durationpb.New(90 * time.Second)}}})
	}
	evs = append(evs, &framepackv1.JobEvent{JobId: "j", Time: at(10), Event: &framepackv1.JobEvent_SectionVideo{SectionVideo: &framepackv1.SectionVideo{Path: "/v/j_33.mp4", FrameCount: 33}}})
	return evs
}

func TestDisplayTerminal(t *testing.T) {
	var b bytes.Buffer
	d := newDisplay(&env{stderr: &b, stderrTTY: true, width: func() int { return 100 }}, false)
	for _, ev := range jobEvents(time.Now()) {
		d.event(ev)
	}
	out := b.String()
	for _, want := range []string{"job j: running\n", "\r\033[Ksection 1/2  transformer step 2/4  [##########", "25%  ETA 1m30s", "section 1/2: video so far: 33 frames\n", " 50%"} {
		if !strings.Contains(out, want) {
			t.Errorf("terminal output lacks %q:\n%q", want, out)
		}
	}
	for _, line := range strings.Split(out, "\r") {
		if len([]rune(line)) > 100 {
			t.Errorf("line wider than the terminal: %q", line)
		}
	}
}

func TestDisplayPlainAndReconnect(t *testing.T) {
	var b bytes.Buffer
	d := newDisplay(&env{stderr: &b}, false)
	evs := jobEvents(time.Now())
	for _, ev := range evs {
		d.event(ev)
	}
	// A reconnect replays the history: nothing is printed twice.
	for _, ev := range evs {
		d.event(ev)
	}
	out := b.String()
	want := "job j: running\ntext encode started\nsection 1/2: transformer started\n" +
		"section 1/2: step 1/4, 12% done, ETA 1m30s\nsection 1/2: step 4/4, 50% done, ETA 1m30s\n" +
		"section 1/2: video so far: 33 frames\n"
	if out != want {
		t.Fatalf("plain output\n got %q\nwant %q", out, want)
	}
}

// decodeEvents is section 1 of 2's VAE decode: four model runs, the ETA falling from 40 s.
func decodeEvents(t0 time.Time) []*framepackv1.JobEvent {
	evs := []*framepackv1.JobEvent{
		{JobId: "j", Time: timestamppb.New(t0), Event: &framepackv1.JobEvent_Snapshot{Snapshot: &framepackv1.Job{Id: "j", State: framepackv1.JobState_JOB_STATE_RUNNING,
			Spec: &framepackv1.JobSpec{TotalSecondLength: 2.4, LatentWindowSize: 9, Steps: 4}}}},
		{JobId: "j", Time: timestamppb.New(t0.Add(time.Millisecond)), Event: &framepackv1.JobEvent_StageStarted{StageStarted: &framepackv1.StageStarted{Stage: framepackv1.Stage_STAGE_VAE_DECODE}}},
	}
	for i := uint32(1); i <= 4; i++ {
		evs = append(evs, &framepackv1.JobEvent{JobId: "j", Time: timestamppb.New(t0.Add(time.Duration(1+i) * time.Millisecond)),
			Event: &framepackv1.JobEvent_StageProgress{StageProgress: &framepackv1.StageProgress{Stage: framepackv1.Stage_STAGE_VAE_DECODE,
				Done: i, Total: 4, Eta: durationpb.New(time.Duration(50-10*i) * time.Second), Fraction: 0.2 + 0.1*float32(i)}}})
	}
	return evs
}

func TestDisplayDecodeProgress(t *testing.T) {
	var b bytes.Buffer
	d := newDisplay(&env{stderr: &b, stderrTTY: true, width: func() int { return 100 }}, false)
	for _, ev := range decodeEvents(time.Now()) {
		d.event(ev)
	}
	out := b.String()
	for _, want := range []string{"section 1/2  vae decode 1/4  [", " 30%  ETA 40s", "section 1/2  vae decode 3/4  [", " 50%  ETA 20s"} {
		if !strings.Contains(out, want) {
			t.Errorf("terminal output lacks %q:\n%q", want, out)
		}
	}

	b.Reset()
	d = newDisplay(&env{stderr: &b}, false)
	for _, ev := range decodeEvents(time.Now()) {
		d.event(ev)
	}
	want := "job j: running\nsection 1/2: vae decode started\n" +
		"section 1/2: vae decode 1/4, 30% done, ETA 40s\nsection 1/2: vae decode 4/4, 60% done, ETA 10s\n"
	if got := b.String(); got != want {
		t.Fatalf("plain output\n got %q\nwant %q", got, want)
	}
}
