package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/framepackd/framepackd/internal/testbin"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
)

// TestUnloadAndKeptWorkers: `devices` lists each lane's kept workers with their caps and time
// left and the lane's memory limit; `unload` sends the lane and models given and prints what
// the server killed; an unknown model is the server's INVALID_ARGUMENT.
func TestUnloadAndKeptWorkers(t *testing.T) {
	bin := testbin.Build(t, "./cmd/framepack")
	dir, err := os.MkdirTemp("", "fpku")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	addr := filepath.Join(dir, "d.sock")
	var mu sync.Mutex
	var asked [][]string
	d, err := api.StartDaemon(api.DaemonConfig{
		StateDir: filepath.Join(dir, "state"),
		Listen:   []api.Addr{{Network: "unix", Address: addr}},
		Lanes:    []string{"cpu"},
		Run:      fakeRunner(make(chan string, 1)),
		Devices: func(context.Context) ([]*framepackv1.Device, error) {
			return []*framepackv1.Device{{Lane: "cpu", Backend: "cpu", LaneState: framepackv1.LaneState_LANE_STATE_HEALTHY,
				TotalMemoryBytes: 16 << 30, MemoryLimitBytes: 8 << 30,
				KeptWorkers: []*framepackv1.KeptWorker{{Model: "transformer", Pid: 7, CapBytes: 3 << 30,
					ExpireTime: timestamppb.New(time.Now().Add(4*time.Minute + 30*time.Second))}, {Model: "vae", Pid: 8, CapBytes: 1 << 30}}}}, nil
		},
		Unload: func(lane string, models []string) ([]*framepackv1.UnloadedWorker, error) {
			mu.Lock()
			asked = append(asked, append([]string{lane}, models...))
			mu.Unlock()
			var out []*framepackv1.UnloadedWorker
			for _, m := range models {
				out = append(out, &framepackv1.UnloadedWorker{Lane: "cpu", Model: m})
			}
			return out, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Kill)
	f := &fixture{bin: bin, dir: dir, addr: addr}

	r := f.cli(t, "devices")
	if r.code != exitOK || !strings.Contains(r.stdout, "KEPT WORKERS") || !strings.Contains(r.stdout, "transformer 3.0 GiB (4m") ||
		!strings.Contains(r.stdout, "vae 1.0 GiB") || !strings.Contains(r.stdout, "lane limit 8.0 GiB") {
		t.Fatalf("devices: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = f.cli(t, "unload", "--lane", "cpu", "transformer", "vae")
	if r.code != exitOK || !strings.Contains(r.stdout, "unloaded transformer on cpu") || !strings.Contains(r.stdout, "unloaded vae on cpu") {
		t.Fatalf("unload: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = f.cli(t, "unload"); r.code != exitOK || !strings.Contains(r.stdout, "no kept worker") {
		t.Fatalf("unload with nothing kept: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = f.cli(t, "unload", "frobnicator"); r.code == exitOK || !strings.Contains(r.stderr, "frobnicator") {
		t.Fatalf("unload of an unknown model: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 2 || !slices.Equal(asked[0], []string{"cpu", "transformer", "vae"}) || !slices.Equal(asked[1], []string{""}) {
		t.Fatalf("requests the server got: %v", asked)
	}
}
