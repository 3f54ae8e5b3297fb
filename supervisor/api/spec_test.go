package api_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
)

func TestWithDefaults(t *testing.T) {
	in := &framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 5, Cfg: 3, Mp4Crf: proto.Uint32(0), UseTeacache: proto.Bool(false)}
	got := api.WithDefaults(in)
	if got.GetLatentWindowSize() != 9 || got.GetSteps() != 25 || got.GetCfg() != 3 || got.GetGs() != 10 ||
		got.GetResolution() != 640 || got.GetMp4Crf() != 0 || got.GetUseTeacache() || got.GetGpuMemoryPreservationGb() != 6 || got.Rs != 0 {
		t.Fatalf("defaults %v", got)
	}
	if in.LatentWindowSize != 0 {
		t.Fatal("input modified")
	}
	d := api.WithDefaults(&framepackv1.JobSpec{})
	if d.GetMp4Crf() != 16 || !d.GetUseTeacache() || d.GetCfg() != 1 {
		t.Fatalf("empty defaults %v", d)
	}
}
