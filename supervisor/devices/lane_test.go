package devices

import (
	"strings"
	"testing"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

func TestParseLane(t *testing.T) {
	for _, tc := range []struct {
		name, lane string
		want       Lane
		device     uint32
		gpu        bool
		err        string
	}{
		{name: "cpu", lane: "cpu", want: Lane{Backend: "cpu"}},
		{name: "cpu lane 1", lane: "cpu:1", want: Lane{Backend: "cpu", Index: 1, numbered: true}, device: 0},
		{name: "cuda", lane: "cuda:3", want: Lane{Backend: "cuda", Index: 3, numbered: true}, device: 3, gpu: true},
		{name: "hip", lane: "hip:0", want: Lane{Backend: "hip", numbered: true}, gpu: true},
		{name: "gpu without index", lane: "cuda", err: "names its device index"},
		{name: "bad index", lane: "cuda:x", err: "bad device index"},
		{name: "negative", lane: "hip:-1", err: "bad device index"},
		{name: "not a backend", lane: "tpu:0", err: "is not a lane"},
		{name: "empty", lane: "", err: "is not a lane"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseLane(tc.lane)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseLane(%q) = %v, %v; want an error with %q", tc.lane, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseLane(%q) = %+v, %v; want %+v", tc.lane, got, err, tc.want)
			}
			if got.String() != tc.lane || got.Device() != tc.device || got.GPU() != tc.gpu {
				t.Errorf("%q: String %q, Device %d, GPU %v", tc.lane, got.String(), got.Device(), got.GPU())
			}
		})
	}
}

func TestSortLanes(t *testing.T) {
	lanes := []string{"cuda:10", "hip:0", "cpu:1", "nonsense", "cpu", "cuda:2", "cuda:0", "cpu:0"}
	SortLanes(lanes)
	if got := strings.Join(lanes, " "); got != "cpu cpu:0 cpu:1 cuda:0 cuda:2 cuda:10 hip:0 nonsense" {
		t.Fatalf("sorted %s", got)
	}
}

func TestResolveLanes(t *testing.T) {
	found := map[string]*framepackv1.Device{
		"cuda:0": {Lane: "cuda:0", PciBusId: "00000000:3B:00.0"},
		"cuda:1": {Lane: "cuda:1", PciBusId: "0000:86:00.0"},
	}
	cpuOnly := map[string]*framepackv1.Device{"cpu": {Lane: "cpu"}}
	for _, tc := range []struct {
		name, spec string
		found      map[string]*framepackv1.Device
		want       string
		err        string
	}{
		{"auto gpus", "auto", found, "cuda:0,cuda:1", ""},
		{"empty is auto", "", found, "cuda:0,cuda:1", ""},
		{"auto cpu", "auto", cpuOnly, "cpu", ""},
		{"bus ids", "86:00.0, 0000:3b:00.0", found, "cuda:1,cuda:0", ""},
		{"cpu lanes", "cpu:0,cpu:1", cpuOnly, "cpu:0,cpu:1", ""},
		{"index", "cuda:1", found, "cuda:1", ""},
		{"twice", "cuda:1,0000:86:00.0", found, "", "named twice"},
		{"twice by spelling", "cpu:1,cpu:01", cpuOnly, "", "named twice"},
		{"unknown bus", "0000:01:00.0", found, "", "no probed GPU at PCI address"},
		{"bad", "tpu:0", found, "", "is not a lane"},
		{"bad index", "cuda:x", found, "", "bad device index"},
		{"none", " , ", found, "", "names no lane"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResolveLanes(tc.spec, tc.found)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, %v; want error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || strings.Join(got, ",") != tc.want {
				t.Fatalf("got %v, %v; want %s", got, err, tc.want)
			}
		})
	}
}

// TestPerLane: every lane gets its own copy of its device (cpu lanes the host's, under their
// own names), so annotating one leaves the probe's record and the other lanes alone; a lane
// without a device is degraded, saying so.
func TestPerLane(t *testing.T) {
	found := map[string]*framepackv1.Device{
		"cpu":    {Lane: "cpu", Name: "host", Backend: "cpu", TotalMemoryBytes: 64 << 30},
		"cuda:0": {Lane: "cuda:0", Name: "gpu0", Backend: "cuda"},
	}
	got := perLane(found, []string{"cpu:0", "cpu:1", "cuda:0", "cuda:1"})
	if len(got) != 4 {
		t.Fatalf("%d devices", len(got))
	}
	for i, want := range []string{"cpu:0", "cpu:1", "cuda:0", "cuda:1"} {
		if got[i].GetLane() != want {
			t.Errorf("device %d is lane %s, want %s", i, got[i].GetLane(), want)
		}
	}
	if got[0].GetName() != "host" || got[1].GetTotalMemoryBytes() != 64<<30 || got[2].GetName() != "gpu0" {
		t.Errorf("devices %v", got)
	}
	got[2].CurrentJobId = "j"
	if found["cuda:0"].GetCurrentJobId() != "" || found["cpu"].GetLane() != "cpu" {
		t.Error("annotating a lane's device changed the probe's record")
	}
	if d := got[3]; d.GetLaneState() != framepackv1.LaneState_LANE_STATE_DEGRADED || d.GetBackend() != "cuda" ||
		!strings.Contains(d.GetLaneStateReason(), "no device") {
		t.Errorf("lane without a device: %v", d)
	}
}
