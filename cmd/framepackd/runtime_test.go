package main

import (
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/gpuversion"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// TestRuntimeMismatchHoldsLane: fake runtime/driver pairs go through the real probe worker (its
// environment, gpuversion.EnvFake) to the daemon, which holds the lanes of that backend with
// a message naming both versions and the fix; the cpu lane beside them stays healthy, and
// --allow-runtime-mismatch keeps the lane.
func TestRuntimeMismatchHoldsLane(t *testing.T) {
	f := newFixture(t)
	f.withModels(t) // a serving daemon: its lanes' own states show
	for _, tc := range []struct {
		name, fake, lane string
		extra            []string
		held             []string // the reason's parts; empty: not held
	}{
		{"rocm 6.4 on a 6.1 driver", "hip:6.4.1/6.1", "hip:0", nil,
			[]string{"runtime mismatch", "ROCm/HIP runtime 6.4.1", "host driver serves 6.1", "known-bad", "ROCM_VERSION=6.1", "--allow-runtime-mismatch"}},
		{"cuda runtime newer than the driver", "cuda:12.8/12.4", "cuda:0", nil,
			[]string{"CUDA runtime 12.8", "serves 12.4", "newer than the host driver serves", "supports CUDA 12.8", "CUDA_VERSION=12.4.0"}},
		{"matching rocm", "hip:6.4.1/6.4", "hip:0", nil, nil},
		{"mismatch allowed", "hip:6.4.1/6.1", "hip:0", []string{"--allow-runtime-mismatch"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(gpuversion.EnvFake, tc.fake) // the daemon's probe worker inherits it
			cmd, logs, conn := f.start(t, append([]string{"--lanes", "cpu," + tc.lane}, tc.extra...)...)
			devs, err := framepackv1.NewDeviceServiceClient(conn).ListDevices(t.Context(), &framepackv1.ListDevicesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			byLane := map[string]*framepackv1.Device{}
			for _, d := range devs.GetDevices() {
				byLane[d.GetLane()] = d
			}
			if d := byLane["cpu"]; d.GetLaneState() != framepackv1.LaneState_LANE_STATE_HEALTHY {
				t.Errorf("cpu lane %v", d)
			}
			d := byLane[tc.lane]
			if len(tc.held) == 0 {
				if d.GetLaneState() == framepackv1.LaneState_LANE_STATE_HELD {
					t.Errorf("lane %s held: %s", tc.lane, d.GetLaneStateReason())
				}
			} else {
				if d.GetLaneState() != framepackv1.LaneState_LANE_STATE_HELD {
					t.Fatalf("lane %s not held: %v\nlogs:\n%s", tc.lane, d, logs.String())
				}
				for _, w := range tc.held {
					if !strings.Contains(d.GetLaneStateReason(), w) {
						t.Errorf("reason %q lacks %q", d.GetLaneStateReason(), w)
					}
				}
				if !strings.Contains(logs.String(), "gpu runtime mismatch: lane held") {
					t.Errorf("no mismatch in the logs:\n%s", logs.String())
				}
			}
			stop(t, cmd, logs)
		})
	}
}
