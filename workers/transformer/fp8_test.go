package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
)

// opForwardWeights is the fp8 fixture's op: the forward with the weights of a single-file
// checkpoint (params.weights) and the config of params.config.
const opForwardWeights = "transformer.forward_weights"

// weightsCase is a transformer.forward_weights case's load: the model folder (the config's) and
// the checkpoint file.
func weightsCase(t *testing.T, fx *parity.Fixture, c parity.Case) (dir, checkpoint string) {
	t.Helper()
	var cfg, weights string
	if !c.Param(t, "config", &cfg) || !c.Param(t, "weights", &weights) {
		t.Fatalf("case %s: params.config and params.weights are required", c.Name)
	}
	return filepath.Dir(filepath.Join(fx.Root, cfg)), filepath.Join(fx.Root, weights)
}

// TestParityFP8Weights loads a transformer worker per case of the fp8 fixture with the case's
// single-file fp8 checkpoint (plain casts, ComfyUI's scaled_fp8, musubi-tuner's fp8_scaled: the
// loader tells them apart from the keys and dtypes) and checks its forward against the
// reference's, computed in float64 from the exactly dequantized weights, within the case's
// tolerance: with every block resident and with all but one streamed from host memory (the
// 8-bit weights and their scales in the host copies). The weights take about a quarter of
// their f32 size in 8 bits, and the load response names the format.
func TestParityFP8Weights(t *testing.T) {
	fx := parity.Load(t, "fp8")
	ran := 0
	for _, c := range fx.Cases {
		t.Run(c.Name, func(t *testing.T) {
			if c.Op != opForwardWeights {
				t.Fatalf("case %s: unknown op %q", c.Name, c.Op)
			}
			ran++
			dir, ck := weightsCase(t, fx, c)
			var format string
			c.Param(t, "format", &format)
			for _, streamed := range []bool{false, true} {
				req := &workerkit.LoadRequest{ModelDir: dir, Checkpoint: ck, Backend: workertest.Backend()}
				if streamed {
					req.MaxResidentBlocks = 1
				}
				p, _ := workertest.Start(t, "transformer")
				resp, err := p.Load(workertest.Ctx(t), req)
				if err != nil {
					t.Fatalf("load %s: %v", filepath.Base(ck), err)
				}
				if format != "" && !strings.HasPrefix(format, resp.WeightsFormat) || resp.WeightsFormat == "" {
					t.Errorf("weights format %q, the fixture's %q", resp.WeightsFormat, format)
				}
				if resp.FP8Compute != "weight_only" {
					t.Errorf("fp8 compute %q, want weight_only (the default)", resp.FP8Compute)
				}
				if streamed && resp.StreamedBlocks == 0 {
					t.Fatalf("no block streamed: %+v", resp)
				}
				half := workertest.HalfActivations(t, resp)
				cc := c.ForActivations(half)
				fc := writeForwardCase(t, shmtest.Arena(t, "job"), cc)
				res, _, err := runForward(t, p, fc.req)
				if err != nil {
					t.Fatalf("run: %v", err)
				}
				what := "sample (fp8 weights, resident)"
				if streamed {
					what = "sample (fp8 weights, streamed)"
				}
				cc.Check(t, what, readFloat(t, res.Outputs[0]), fc.shape, cc.Output(t, "sample"))
			}
		})
	}
	if ran == 0 {
		t.Fatal("no transformer.forward_weights cases")
	}
}
