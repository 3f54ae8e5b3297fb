package pipeline

import (
	"errors"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/workerkit"
)

func TestModelFacts(t *testing.T) {
	lat := zeros(1, 16, 1, 8, 12) // a 64×96 frame at 8× compression
	vae := func(sf float64, ch, ratio uint32) *workerkit.LoadResponse {
		return &workerkit.LoadResponse{VAE: &workerkit.VAEInfo{ScalingFactor: sf, LatentChannels: ch, SpatialCompressionRatio: ratio}}
	}
	sf, s, err := vaeFacts(vae(0.476986, 16, 8), lat, 64, 96)
	if err != nil || sf != float32(0.476986) || s != "0.476986" {
		t.Fatalf("vaeFacts = %v %q %v", sf, s, err)
	}
	if back, err := parseScalingFactor(s); err != nil || back != sf {
		t.Fatalf("round trip %v %v", back, err)
	}
	for name, resp := range map[string]*workerkit.LoadResponse{
		"no facts": {}, "nil": nil, "zero factor": vae(0, 16, 8), "channels": vae(0.5, 4, 8), "ratio": vae(0.5, 16, 16),
	} {
		if _, _, err := vaeFacts(resp, lat, 64, 96); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	tr := func(in, patch, patchT uint32) *workerkit.LoadResponse {
		return &workerkit.LoadResponse{Transformer: &workerkit.TransformerInfo{InChannels: in, OutChannels: in, PatchSize: patch, PatchSizeT: patchT}}
	}
	if err := checkTransformerFacts(tr(16, 2, 1), lat); err != nil {
		t.Fatal(err)
	}
	if err := checkTransformerFacts(tr(16, 5, 1), lat); !errors.Is(err, errBadInput) || !strings.Contains(err.Error(), "patch size 5") {
		t.Errorf("patch 5: %v", err)
	}
	for name, resp := range map[string]*workerkit.LoadResponse{"no facts": {}, "channels": tr(8, 2, 1), "temporal patch": tr(16, 2, 2)} {
		if err := checkTransformerFacts(resp, lat); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := parseScalingFactor(""); err == nil {
		t.Error("empty scaling factor accepted")
	}
}
