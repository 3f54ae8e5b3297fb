package main

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// TestDaemonKeepAliveUnload: a daemon with --keep-alive keeps a job's workers after it
// (ListDevices lists them with their caps and expiry, and the lane's --lane-memory-gb limit);
// UnloadModels kills the named ones and then the rest; a job's keep_alive of 0 keeps none.
func TestDaemonKeepAliveUnload(t *testing.T) {
	f := newFixture(t)
	f.withWorkers(t)
	cmd, logs, conn := f.start(t, "--lanes", "cpu", "--cpu-device-memory-gb", "16", "--keep-alive", "1h", "--lane-memory-gb", "8")
	defer stop(t, cmd, logs)
	jc := framepackv1.NewJobServiceClient(conn)
	dc := framepackv1.NewDeviceServiceClient(conn)
	kept := func() []string {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		resp, err := dc.ListDevices(ctx, &framepackv1.ListDevicesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, d := range resp.GetDevices() {
			if d.GetMemoryLimitBytes() != 8<<30 {
				t.Errorf("lane %s memory limit %d, want 8 GiB", d.GetLane(), d.GetMemoryLimitBytes())
			}
			for _, k := range d.GetKeptWorkers() {
				if k.GetCapBytes() == 0 || k.GetCapBytes() > 8<<30 || k.GetPid() <= 0 || k.GetExpireTime() == nil {
					t.Errorf("kept worker %+v: want a cap within the limit, a pid and an expiry", k)
				}
				out = append(out, k.GetModel())
			}
		}
		slices.Sort(out)
		return out
	}
	if last := runJob(t, jc, tinyJobRequest(t)); last.GetJobFinished() == nil {
		t.Fatalf("job: %v\nlogs:\n%s", last, logs.String())
	}
	if got := kept(); !slices.Equal(got, []string{"clipvision", "textenc", "transformer", "vae"}) {
		t.Fatalf("kept workers after a job with a keep-alive: %v\nlogs:\n%s", got, logs.String())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := dc.UnloadModels(ctx, &framepackv1.UnloadModelsRequest{Models: []string{"frobnicator"}}); err == nil {
		t.Fatal("unload of an unknown model accepted")
	}
	resp, err := dc.UnloadModels(ctx, &framepackv1.UnloadModelsRequest{Lane: "cpu", Models: []string{"transformer", "vae"}})
	if err != nil || len(resp.GetUnloaded()) != 2 {
		t.Fatalf("unload transformer and vae: %v %v", resp, err)
	}
	if got := kept(); !slices.Equal(got, []string{"clipvision", "textenc"}) {
		t.Fatalf("kept workers after unloading two: %v", got)
	}
	if resp, err = dc.UnloadModels(ctx, &framepackv1.UnloadModelsRequest{}); err != nil || len(resp.GetUnloaded()) != 2 {
		t.Fatalf("unload the rest: %v %v", resp, err)
	}
	if got := kept(); len(got) != 0 {
		t.Fatalf("kept workers after unloading all: %v", got)
	}
	req := tinyJobRequest(t)
	req.Spec.KeepAlive = durationpb.New(0)
	if last := runJob(t, jc, req); last.GetJobFinished() == nil {
		t.Fatalf("job with keep_alive 0: %v", last)
	}
	if got := kept(); len(got) != 0 {
		t.Fatalf("kept workers after a job with keep_alive 0: %v", got)
	}
}
