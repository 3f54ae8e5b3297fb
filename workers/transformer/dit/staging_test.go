package dit

import (
	"fmt"
	"testing"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/runtime"
)

// TestStagedUploadBitIdentical loads the fixture's transformer (bf16 in its checkpoint) with
// staged upload forced on ($FRAMEPACK_STAGED_UPLOAD) and runs every transformer.forward case:
// the output is the unstaged model's bit for bit and within the case's tolerance of the
// reference, with the default slots and with 4 KiB ones (most matrices larger than a slot:
// uploaded by LoadTensor), with bf16 activations and as-stored weights (every tensor staged),
// f32 activations (the bf16 weights staged, the norms converted) and one block streamed.
func TestStagedUploadBitIdentical(t *testing.T) {
	fx := parity.Load(t, "transformer")
	cases := forwardCases(t, fx)
	for _, o := range []LoadOptions{
		{ActivationDType: runtime.BF16, WeightDType: runtime.AsStored},
		{WeightDType: runtime.AsStored},
		{WeightDType: runtime.AsStored, MaxResidentBlocks: 1},
	} {
		rt := newTestRuntime(t)
		t.Setenv(nn.EnvStagedUpload, "0")
		plain := loadWith(t, rt, fx, o)
		if plain.StagedBytes() != 0 {
			t.Fatalf("staging off: %d bytes staged", plain.StagedBytes())
		}
		want := forwardOuts(t, plain, cases)
		for _, slot := range []string{"", "4096"} {
			what := fmt.Sprintf("activations %s, weights %s, max resident blocks %d, slot %q", o.ActivationDType, o.WeightDType, o.MaxResidentBlocks, slot)
			t.Setenv(nn.EnvStagedUpload, "1")
			t.Setenv(nn.EnvStagedUploadSlotBytes, slot)
			m := loadWith(t, rt, fx, o)
			staged := m.StagedBytes()
			switch {
			case staged == 0:
				t.Fatalf("%s: nothing staged", what)
			case slot != "" && staged >= m.Weights.WeightBytes():
				t.Errorf("%s: all %d resident bytes staged, want the matrices larger than a slot left to LoadTensor", what, staged)
			case slot == "" && o.ActivationDType == runtime.BF16 && staged != m.Weights.WeightBytes():
				t.Errorf("%s: %d of %d resident bytes staged, want all (every tensor bf16 already)", what, staged, m.Weights.WeightBytes())
			}
			compareForwards(t, what, m, cases, want, true)
			m.Close()
		}
	}
}
