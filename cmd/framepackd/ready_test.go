package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/framepackd/framepackd/internal/testbin"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// TestReadiness is issue 15's readiness item: a daemon whose model files are corrupt says
// NOT_SERVING and refuses jobs at submit naming the file; once the file is fixed, ListDevices
// re-checks and it serves again. A job pinned to a lane with no device is refused at submit,
// and on the tiny models a job without a resolution is refused instead of running at 640.
func TestReadiness(t *testing.T) {
	f := newFixture(t)
	f.withWorkers(t)
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	// A private copy of the tiny models whose VAE weights we can break.
	models := filepath.Join(f.dir, "models")
	if err := os.Remove(models); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-r", filepath.Join(root, "testdata", "parity", "models"), models).CombinedOutput(); err != nil {
		t.Fatalf("copy models: %v %s", err, out)
	}
	weights, err := filepath.Glob(filepath.Join(models, "hunyuanvideo", "vae", "*.safetensors"))
	if err != nil || len(weights) == 0 {
		t.Fatalf("vae weights: %v %v", weights, err)
	}
	good, err := os.ReadFile(weights[0])
	if err != nil {
		t.Fatal(err)
	}
	bad := append([]byte(nil), good...)
	copy(bad[8:], "{not json")
	if err := os.WriteFile(weights[0], bad, 0o644); err != nil {
		t.Fatal(err)
	}

	_, logs, conn := f.start(t, "--lanes", "cpu,cuda:7")
	if f.lastHealth != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health with a corrupt model file: %v\nlogs:\n%s", f.lastHealth, logs.String())
	}
	client := framepackv1.NewJobServiceClient(conn)
	req := tinyJobRequest(t)
	_, err = client.SubmitJob(t.Context(), req)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), weights[0]) {
		t.Fatalf("submit with a corrupt model file: %v", err)
	}

	// Fixed: the next ListDevices re-checks; health turns SERVING (watched, not polled).
	if err := os.WriteFile(weights[0], good, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	devs, err := framepackv1.NewDeviceServiceClient(conn).ListDevices(ctx, &framepackv1.ListDevicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		r, err := watch.Recv()
		if err != nil {
			t.Fatalf("health after the fix: %v\nlogs:\n%s", err, logs.String())
		}
		if r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
	}

	// A lane whose device is missing: refused at submit with the reason.
	var cudaState framepackv1.LaneState
	for _, d := range devs.GetDevices() {
		if d.GetLane() == "cuda:7" {
			cudaState = d.GetLaneState()
		}
	}
	if cudaState != framepackv1.LaneState_LANE_STATE_DEGRADED {
		t.Fatalf("devices %v", devs)
	}
	pinned := tinyJobRequest(t)
	pinned.Spec.Lane = "cuda:7"
	if _, err := client.SubmitJob(t.Context(), pinned); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "cuda:7") {
		t.Fatalf("submit to a lane without a device: %v", err)
	}
	// Issue 32: the tiny models' own resolution is every client's default, and FramePack's
	// 640 table, which would run them for minutes a section on a CPU, is refused whoever
	// asks for it (the CLI and the page used to send 640 explicitly).
	defaults, err := client.GetJobDefaults(t.Context(), &framepackv1.GetJobDefaultsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if s := defaults.GetSpec(); s.GetResolution() != 96 || s.GetSeed() != 31337 || s.GetSteps() != 25 || s.Seed == nil {
		t.Fatalf("defaults on the tiny models: %v", s)
	}
	if rs := defaults.GetResolutions(); len(rs) != 2 || rs[0].GetResolution() != 96 || rs[0].GetUnavailableReason() != "" || len(rs[0].GetBuckets()) != 3 ||
		rs[1].GetResolution() != 640 || !strings.Contains(rs[1].GetUnavailableReason(), "not FramePack's full-size") {
		t.Fatalf("resolutions on the tiny models: %v", rs)
	}
	at640 := tinyJobRequest(t)
	at640.Spec.Resolution = 640
	if _, err := client.SubmitJob(t.Context(), at640); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--resolution 96") {
		t.Fatalf("submit at 640 on the tiny models: %v", err)
	}
	noRes := tinyJobRequest(t)
	noRes.Spec.Resolution = 0
	resp, err := client.SubmitJob(t.Context(), noRes)
	if err != nil || resp.GetJob().GetSpec().GetResolution() != 96 {
		t.Fatalf("submit without a resolution on the tiny models: %v %v", resp.GetJob().GetSpec(), err)
	}
	// Own buckets are the client's to choose.
	own := tinyJobRequest(t)
	own.Spec.Resolution, own.Spec.Buckets = 640, []*framepackv1.Bucket{{Height: 64, Width: 64}}
	if _, err := client.SubmitJob(t.Context(), own); err != nil {
		t.Fatalf("own buckets: %v", err)
	}
}

// TestModelsAppearAfterStart is issue 32's readiness item: a daemon started before its models
// folder exists says NOT_SERVING and why on every surface, and once the folder appears it
// serves within seconds, without a restart or a client's call, and runs jobs.
func TestModelsAppearAfterStart(t *testing.T) {
	f := newFixture(t)
	f.withWorkers(t)
	models := filepath.Join(f.dir, "models")
	target, err := os.Readlink(models)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(models); err != nil {
		t.Fatal(err)
	}
	_, logs, conn := f.start(t)
	if f.lastHealth != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health without models: %v", f.lastHealth)
	}
	devs, err := framepackv1.NewDeviceServiceClient(conn).ListDevices(t.Context(), &framepackv1.ListDevicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r := devs.GetNotServingReason(); !strings.Contains(r, "no variant can run") || len(devs.GetDevices()) != 1 ||
		devs.GetDevices()[0].GetLaneState() != framepackv1.LaneState_LANE_STATE_NOT_SERVING || devs.GetDevices()[0].GetLaneStateReason() != r {
		t.Fatalf("devices without models: %v", devs)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health watch: %v %v", r, err)
	}
	if err := os.Symlink(target, models); err != nil {
		t.Fatal(err)
	}
	appeared := time.Now()
	for {
		r, err := watch.Recv()
		if err != nil {
			t.Fatalf("health after the models appeared: %v\nlogs:\n%s", err, logs.String())
		}
		if r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
	}
	t.Logf("serving %v after the models appeared", time.Since(appeared).Round(time.Millisecond))
	if ev := runJob(t, framepackv1.NewJobServiceClient(conn), tinyJobRequest(t)); ev.GetJobFinished() == nil {
		t.Fatalf("job after the models appeared: %v\nlogs:\n%s", ev, logs.String())
	}
}
