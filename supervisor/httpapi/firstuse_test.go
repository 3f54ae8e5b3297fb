package httpapi_test

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/httpapi/httpapitest"
)

// TestRESTDefaults is issue 32's defaults item over REST: one set of defaults, applied by the
// server whichever client asks. A spec without a seed gets 31337, as the CLI and the page
// offer (REST gave 0); a spec without a resolution gets the served models' own (96 on the tiny
// models), which GET /v1/jobs:defaults announces; 640 on the tiny models is refused.
func TestRESTDefaults(t *testing.T) {
	d := httpapitest.Start(t, httpapitest.Options{})
	imgPath, err := httpapitest.DemoImage()
	if err != nil {
		t.Fatal(err)
	}
	image, err := os.ReadFile(imgPath)
	if err != nil {
		t.Fatal(err)
	}

	code, _, raw := do(t, "GET", d.URL+"/v1/jobs:defaults", "", nil)
	if code != http.StatusOK {
		t.Fatalf("GET /v1/jobs:defaults: %d %s", code, raw)
	}
	var defaults framepackv1.GetJobDefaultsResponse
	if err := protojson.Unmarshal(raw, &defaults); err != nil {
		t.Fatalf("defaults %s: %v", raw, err)
	}
	if s := defaults.GetSpec(); s.GetSeed() != 31337 || s.GetResolution() != 96 || s.GetLatentWindowSize() != 9 || !s.GetUseTeacache() ||
		s.GetMp4Crf() != 16 || s.GetGpuMemoryPreservationGb() != 6 {
		t.Fatalf("defaults spec: %v", s)
	}
	if rs := defaults.GetResolutions(); len(rs) != 2 || rs[0].GetResolution() != 96 || rs[0].GetLabel() != "tiny test models" ||
		rs[1].GetResolution() != 640 || rs[1].GetUnavailableReason() == "" {
		t.Fatalf("defaults resolutions: %v", rs)
	}

	submit := func(spec string) (int, []byte) {
		t.Helper()
		body, _ := protojson.Marshal(&framepackv1.SubmitJobRequest{Image: image})
		// The spec as a client writes it (fields left out are unset).
		body = bytes.Replace(body, []byte("{"), []byte(`{"spec":`+spec+`,`), 1)
		code, _, raw := do(t, "POST", d.URL+"/v1/jobs", "application/json", bytes.NewReader(body))
		if code == http.StatusOK {
			// Only the stored spec matters here: the job need not run.
			id := jobOf(t, raw).GetId()
			if c, _, r := do(t, "POST", d.URL+"/v1/jobs/"+id+":cancel", "application/json", strings.NewReader(`{}`)); c != http.StatusOK {
				t.Fatalf("cancel %s: %d %s", id, c, r)
			}
		}
		return code, raw
	}
	code, raw = submit(`{"prompt":"a cat","totalSecondLength":1}`)
	if code != http.StatusOK {
		t.Fatalf("submit without seed and resolution: %d %s", code, raw)
	}
	if s := jobOf(t, raw).GetSpec(); s.Seed == nil || s.GetSeed() != 31337 || s.GetResolution() != 96 {
		t.Fatalf("stored spec of a job without seed and resolution: seed %v, resolution %d", s.Seed, s.GetResolution())
	}
	code, raw = submit(`{"prompt":"a cat","totalSecondLength":1,"seed":"0","resolution":96}`)
	if s := jobOf(t, raw).GetSpec(); code != http.StatusOK || s.Seed == nil || s.GetSeed() != 0 {
		t.Fatalf("seed 0 asked for: %d %s", code, raw)
	}
	code, raw = submit(`{"prompt":"a cat","totalSecondLength":1,"resolution":640}`)
	if code != http.StatusBadRequest || !strings.Contains(errorOf(t, raw).Message, "framepack generate --resolution 96") {
		t.Fatalf("640 on the tiny models: %d %s", code, raw)
	}
}

// TestRESTNotServing is issue 32's NOT_SERVING item over HTTP: while the server cannot run
// jobs, /v1/devices shows its lane not serving with the reason (it said "healthy"), /metrics
// says framepack_serving 0 and the lane's not_serving state, and a submit is refused with the
// reason.
func TestRESTNotServing(t *testing.T) {
	const why = "no variant can run: framepack: check models: model /m/vae: open config.json: no such file"
	var broken atomic.Bool
	broken.Store(true)
	d := httpapitest.Start(t, httpapitest.Options{Ready: func() error {
		if broken.Load() {
			return errors.New(why)
		}
		return nil
	}})
	code, _, raw := do(t, "GET", d.URL+"/v1/devices", "", nil)
	var devs framepackv1.ListDevicesResponse
	if code != http.StatusOK || protojson.Unmarshal(raw, &devs) != nil {
		t.Fatalf("GET /v1/devices: %d %s", code, raw)
	}
	if len(devs.GetDevices()) != 1 || devs.GetNotServingReason() != why ||
		devs.GetDevices()[0].GetLaneState() != framepackv1.LaneState_LANE_STATE_NOT_SERVING || devs.GetDevices()[0].GetLaneStateReason() != why {
		t.Fatalf("devices while not serving: %s", raw)
	}
	_, _, metrics := do(t, "GET", d.URL+"/metrics", "", nil)
	for _, want := range []string{"framepack_serving 0\n", `framepack_lane_state{lane="cpu",state="not_serving"} 1` + "\n", `framepack_lane_state{lane="cpu",state="healthy"} 0` + "\n"} {
		if !bytes.Contains(metrics, []byte(want)) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	body, _ := protojson.Marshal(&framepackv1.SubmitJobRequest{Image: []byte("x"), Spec: httpapitest.TinySpec(1, 1)})
	code, _, raw = do(t, "POST", d.URL+"/v1/jobs", "application/json", bytes.NewReader(body))
	if code != http.StatusServiceUnavailable || errorOf(t, raw).Message != "the server cannot run jobs now: "+why {
		t.Fatalf("submit while not serving: %d %s", code, raw)
	}

	// Fixed: the next listing says it serves.
	broken.Store(false)
	code, _, raw = do(t, "GET", d.URL+"/v1/devices", "", nil)
	devs.Reset()
	if code != http.StatusOK || protojson.Unmarshal(raw, &devs) != nil || devs.GetNotServingReason() != "" ||
		devs.GetDevices()[0].GetLaneState() != framepackv1.LaneState_LANE_STATE_HEALTHY {
		t.Fatalf("devices once ready: %d %s", code, raw)
	}
}
