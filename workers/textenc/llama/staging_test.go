package llama

import (
	"fmt"
	"testing"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
)

// TestStagedUploadBitIdentical computes the fixture's hidden states (fp16 in its checkpoint)
// with staged upload forced on ($FRAMEPACK_STAGED_UPLOAD) and compares them bit for bit with
// the unstaged model's: fp16 activations with as-stored weights (every resident tensor
// staged) and f32 activations (the fp16 matrices staged, the norms converted), one layer
// streamed, with the default slots and with 1 KiB ones (the larger matrices uploaded by
// LoadTensor).
func TestStagedUploadBitIdentical(t *testing.T) {
	dir, ids, mask := promptFixture(t)
	for _, o := range []Options{
		{HiddenStateIndex: -1, Options: nn.Options{DType: runtime.F16, WeightDType: runtime.AsStored}},
		{HiddenStateIndex: -1, Options: nn.Options{WeightDType: runtime.AsStored}},
		{HiddenStateIndex: -1, Options: nn.Options{WeightDType: runtime.AsStored}, MaxResidentLayers: 1},
	} {
		rt := newRuntime(t, nil)
		t.Setenv(nn.EnvStagedUpload, "0")
		want, plain := hiddenStates(t, rt, dir, ids, mask, o)
		if plain.Weights.StagedBytes() != 0 {
			t.Fatalf("staging off: %d bytes staged", plain.Weights.StagedBytes())
		}
		for _, slot := range []string{"", "1024"} {
			what := fmt.Sprintf("activations %s, weights %s, max resident layers %d, slot %q", o.DType, o.WeightDType, o.MaxResidentLayers, slot)
			t.Setenv(nn.EnvStagedUpload, "1")
			t.Setenv(nn.EnvStagedUploadSlotBytes, slot)
			got, m := hiddenStates(t, rt, dir, ids, mask, o)
			staged, resident := m.Weights.StagedBytes(), m.Weights.WeightBytes()
			m.Close()
			switch {
			case staged == 0:
				t.Fatalf("%s: nothing staged", what)
			case slot != "" && staged >= resident:
				t.Errorf("%s: all %d resident bytes staged, want the matrices larger than a slot left to LoadTensor", what, staged)
			case slot == "" && o.DType == runtime.F16 && staged != resident:
				t.Errorf("%s: %d of %d resident bytes staged, want all (every tensor fp16 already)", what, staged, resident)
			}
			sameBits(t, what, "unstaged", got, want)
		}
		plain.Close()
	}
}
