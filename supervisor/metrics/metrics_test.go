package metrics_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/durationpb"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/metrics"
)

func ev(id string, e any) *framepackv1.JobEvent {
	out := &framepackv1.JobEvent{JobId: id}
	switch v := e.(type) {
	case *framepackv1.StageStarted:
		out.Event = &framepackv1.JobEvent_StageStarted{StageStarted: v}
	case *framepackv1.StageFinished:
		out.Event = &framepackv1.JobEvent_StageFinished{StageFinished: v}
	case *framepackv1.RetryEvent:
		out.Event = &framepackv1.JobEvent_Retry{Retry: v}
	case *framepackv1.FallbackEvent:
		out.Event = &framepackv1.JobEvent_Fallback{Fallback: v}
	case *framepackv1.JobFailed:
		out.Event = &framepackv1.JobEvent_JobFailed{JobFailed: v}
	case *framepackv1.SamplingStep:
		out.Event = &framepackv1.JobEvent_SamplingStep{SamplingStep: v}
	}
	return out
}

// TestFaultsAndDevices feeds the events of a job that retries after an OOM and a hang, falls
// back a conv tier and gives up after a crash, on a cuda lane, and scrapes.
func TestFaultsAndDevices(t *testing.T) {
	devices := []*framepackv1.Device{
		{Lane: "cuda:0", Backend: "cuda", TotalMemoryBytes: 24 << 30, UsedMemoryBytes: 3 << 30, LaneState: framepackv1.LaneState_LANE_STATE_HELD, LaneStateReason: "vram not returned", CurrentJobId: "abc"},
		{Lane: "cuda:1", Backend: "cuda", TotalMemoryBytes: 24 << 30, LaneState: framepackv1.LaneState_LANE_STATE_DEGRADED},
		// A lane whose device is fine while the server does not serve (its models are missing).
		{Lane: "cuda:2", Backend: "cuda", TotalMemoryBytes: 24 << 30, LaneState: framepackv1.LaneState_LANE_STATE_NOT_SERVING, LaneStateReason: "no variant can run"},
	}
	calls := 0
	m := metrics.New(metrics.Config{
		Jobs: func() (map[framepackv1.JobState]int, error) {
			return map[framepackv1.JobState]int{framepackv1.JobState_JOB_STATE_QUEUED: 3, framepackv1.JobState_JOB_STATE_FAILED: 1}, nil
		},
		Devices: func(context.Context) (*framepackv1.ListDevicesResponse, error) {
			calls++
			return &framepackv1.ListDevicesResponse{Devices: devices, NotServingReason: "no variant can run"}, nil
		},
	})
	vae := framepackv1.Stage_STAGE_VAE_DECODE
	for _, e := range []*framepackv1.JobEvent{
		ev("j", &framepackv1.StageStarted{Stage: vae, Lane: "cuda:0"}),
		ev("j", &framepackv1.FallbackEvent{Stage: vae, FromTier: framepackv1.ConvTier_CONV_TIER_VENDOR_TUNED, ToTier: framepackv1.ConvTier_CONV_TIER_VENDOR_DEFAULT}),
		ev("j", &framepackv1.RetryEvent{Attempt: &framepackv1.Attempt{Stage: vae, Class: framepackv1.AttemptClass_ATTEMPT_CLASS_OOM}}),
		ev("j", &framepackv1.RetryEvent{Attempt: &framepackv1.Attempt{Stage: vae, Class: framepackv1.AttemptClass_ATTEMPT_CLASS_HANG}}),
		ev("j", &framepackv1.StageFinished{Stage: vae, Duration: durationpb.New(3 * time.Second), LoadDuration: durationpb.New(time.Second)}),
		ev("j", &framepackv1.SamplingStep{StepDuration: durationpb.New(time.Second)}),
		ev("j", &framepackv1.JobFailed{Failure: &framepackv1.JobFailure{Stage: vae, Attempts: []*framepackv1.Attempt{{Class: framepackv1.AttemptClass_ATTEMPT_CLASS_CRASH}}}}),
		ev("other", &framepackv1.SamplingStep{StepDuration: durationpb.New(time.Second)}), // no lane known
	} {
		m.Observe(e)
	}
	m.ObserveStage(metrics.StageRecord{Lane: "cuda:0", Worker: "vae", Err: "oom", ConvTiers: []metrics.ConvTier{
		{Tier: "vendor_tuned", Attempts: 3, Successes: 2, Failures: 1, Time: 2 * time.Second}, {Tier: "cpu", Successes: 1}}})
	m.ObserveStage(metrics.StageRecord{Lane: "cuda:0", Worker: "transformer", Reused: true, Kept: true})

	want := `
# HELP framepack_faults_total Failed stage attempts, retried or final, by fault class.
# TYPE framepack_faults_total counter
framepack_faults_total{class="bad_input"} 0
framepack_faults_total{class="crash"} 1
framepack_faults_total{class="device_lost"} 0
framepack_faults_total{class="hang"} 1
framepack_faults_total{class="oom"} 1
# HELP framepack_stage_retries_total Stage attempts that failed and were tried again, by stage and fault class.
# TYPE framepack_stage_retries_total counter
framepack_stage_retries_total{class="hang",stage="vae_decode"} 1
framepack_stage_retries_total{class="oom",stage="vae_decode"} 1
# HELP framepack_give_ups_total Jobs that failed for good, by the stage that failed.
# TYPE framepack_give_ups_total counter
framepack_give_ups_total{stage="vae_decode"} 1
# HELP framepack_conv_fallbacks_total Convolutions that left a tier of the fallback chain, by the tier left and the tier used next.
# TYPE framepack_conv_fallbacks_total counter
framepack_conv_fallbacks_total{from="vendor_tuned",to="vendor_default"} 1
# HELP framepack_worker_spawns_total Worker processes started, by model.
# TYPE framepack_worker_spawns_total counter
framepack_worker_spawns_total{model="vae"} 1
# HELP framepack_worker_exits_total Worker processes ended after a stage, by model and reason (done: the stage succeeded; failed: it did not).
# TYPE framepack_worker_exits_total counter
framepack_worker_exits_total{model="vae",reason="failed"} 1
# HELP framepack_queue_depth Jobs waiting for a lane.
# TYPE framepack_queue_depth gauge
framepack_queue_depth 3
# HELP framepack_lane_state 1 for the lane's current state (healthy, degraded, held, not_serving), 0 for the others.
# TYPE framepack_lane_state gauge
framepack_lane_state{lane="cuda:0",state="degraded"} 0
framepack_lane_state{lane="cuda:0",state="healthy"} 0
framepack_lane_state{lane="cuda:0",state="held"} 1
framepack_lane_state{lane="cuda:0",state="not_serving"} 0
framepack_lane_state{lane="cuda:1",state="degraded"} 1
framepack_lane_state{lane="cuda:1",state="healthy"} 0
framepack_lane_state{lane="cuda:1",state="held"} 0
framepack_lane_state{lane="cuda:1",state="not_serving"} 0
framepack_lane_state{lane="cuda:2",state="degraded"} 0
framepack_lane_state{lane="cuda:2",state="healthy"} 0
framepack_lane_state{lane="cuda:2",state="held"} 0
framepack_lane_state{lane="cuda:2",state="not_serving"} 1
# HELP framepack_device_memory_used_bytes Device memory in use, as the driver reports it, by lane.
# TYPE framepack_device_memory_used_bytes gauge
framepack_device_memory_used_bytes{backend="cuda",lane="cuda:0"} 3.221225472e+09
framepack_device_memory_used_bytes{backend="cuda",lane="cuda:1"} 0
framepack_device_memory_used_bytes{backend="cuda",lane="cuda:2"} 0
# HELP framepack_lane_busy 1 while the lane runs a job.
# TYPE framepack_lane_busy gauge
framepack_lane_busy{lane="cuda:0"} 1
framepack_lane_busy{lane="cuda:1"} 0
framepack_lane_busy{lane="cuda:2"} 0
# HELP framepack_serving 1 while the server runs jobs (gRPC health SERVING), 0 while it does not: framepack health and framepack devices say why.
# TYPE framepack_serving gauge
framepack_serving 0
`
	names := []string{"framepack_faults_total", "framepack_stage_retries_total", "framepack_give_ups_total", "framepack_conv_fallbacks_total",
		"framepack_worker_spawns_total", "framepack_worker_exits_total", "framepack_queue_depth", "framepack_lane_state",
		"framepack_device_memory_used_bytes", "framepack_lane_busy", "framepack_serving"}
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	// Stage durations carry the lane's backend; a step of a job whose lane is unknown says so.
	for _, c := range []struct {
		name string
		want int
	}{
		{`framepack_stage_duration_seconds_count{backend="cuda",stage="vae_decode"} 1`, 1},
		{`framepack_stage_load_seconds_count{backend="cuda",stage="vae_decode"} 1`, 1},
		{`framepack_sampling_step_seconds_count{backend="unknown"} 1`, 1},
		{`framepack_conv_decisions_total{outcome="success",tier="vendor_tuned"} 2`, 1},
		{`framepack_conv_decisions_total{outcome="failure",tier="vendor_tuned"} 1`, 1},
		{`framepack_conv_seconds_total{tier="vendor_tuned"} 2`, 1},
		{`framepack_jobs{state="queued"} 3`, 1},
	} {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		if n := strings.Count(rec.Body.String(), c.name+"\n"); n != c.want {
			t.Errorf("%s: %d times in the scrape", c.name, n)
		}
	}
	// The job's lane was forgotten at its terminal event: a later step of it has no backend.
	m.Observe(ev("j", &framepackv1.SamplingStep{StepDuration: durationpb.New(time.Second)}))
	if n := testutil.CollectAndCount(m.Registry(), "framepack_sampling_step_seconds"); n != 2 {
		t.Errorf("%d sampling step series, want 2 (cuda's and unknown)", n)
	}
	// Devices are listed at most once per 10 s, however often scraped.
	if calls != 1 {
		t.Errorf("devices listed %d times", calls)
	}
}

func TestScrapeErrors(t *testing.T) {
	m := metrics.New(metrics.Config{
		Jobs: func() (map[framepackv1.JobState]int, error) { return nil, errors.New("store closed") },
		Devices: func(context.Context) (*framepackv1.ListDevicesResponse, error) {
			return nil, errors.New("probe failed")
		},
	})
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	// The rest is still served.
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "framepack_jobs_ended_total") {
		t.Errorf("scrape with failing sources: %d\n%.300s", rec.Code, rec.Body.String())
	}
}
