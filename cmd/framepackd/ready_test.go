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
	// Tiny models, no resolution: refused, saying which resolution to use.
	noRes := tinyJobRequest(t)
	noRes.Spec.Resolution = 0
	if _, err := client.SubmitJob(t.Context(), noRes); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--resolution 96") {
		t.Fatalf("submit without resolution on the tiny models: %v", err)
	}
	if _, err := client.SubmitJob(t.Context(), tinyJobRequest(t)); err != nil {
		t.Fatalf("good job: %v", err)
	}
}
