package siglip

import (
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/runtime"
)

func newRuntime(t *testing.T) *runtime.Runtime {
	t.Helper()
	rt, err := runtime.New(runtime.Options{Threads: 2, Poison: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Errorf("close runtime: %v", err)
		}
	})
	return rt
}

// endToEndTolerance is the bound for last_hidden_state computed from the uint8 image.
const endToEndTolerance = 1e-3

func toInts(s []int64) []int {
	out := make([]int, len(s))
	for i, d := range s {
		out[i] = int(d)
	}
	return out
}

func toInt64s(s []int) []int64 {
	out := make([]int64, len(s))
	for i, d := range s {
		out[i] = int64(d)
	}
	return out
}

// TestParitySiglip runs every siglip.encode case in process: the model on the fixture's pixel
// values (the case's tolerance) and the whole encoder from the uint8 image (1e-3), with the
// model and processor configs of the fixture set.
func TestParitySiglip(t *testing.T) { paritySiglip(t, runtime.F32) }

// TestParitySiglipHalf is TestParitySiglip with fp16 activations (FramePack's image encoder
// dtype, or the 16-bit one $FRAMEPACK_ACTIVATION_DTYPE names): within parity.HalfRelL2.
func TestParitySiglipHalf(t *testing.T) {
	act, err := runtime.ParseActivationDType(parity.HalfActivations("fp16"))
	if err != nil {
		t.Fatal(err)
	}
	paritySiglip(t, act)
}

func paritySiglip(t *testing.T, act runtime.DType) {
	fx := parity.Load(t, "siglip")
	rt := newRuntime(t)
	encDir, err := fx.ModelPath("image_encoder")
	if err != nil {
		t.Fatal(err)
	}
	feDir, err := fx.ModelPath("feature_extractor")
	if err != nil {
		t.Fatal(err)
	}
	enc, err := LoadEncoder(rt, encDir, feDir, BackendTorchvision, LoadOptions{DType: act})
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Free()
	rep := enc.Model.Report()
	if len(rep.Unexpected) != 0 {
		t.Errorf("unexpected checkpoint tensors: %v", rep.Unexpected)
	}
	t.Logf("loaded %d tensors (%d bytes), skipped %d (pooling head)", rep.Loaded, rep.Bytes, len(rep.Skipped))
	n := 0
	for _, c := range fx.Cases {
		if c.Op != "siglip.encode" {
			continue
		}
		c = c.ForActivations(act != runtime.F32)
		endTol := endToEndTolerance
		if act != runtime.F32 {
			endTol = max(endTol, parity.HalfRelL2)
		}
		n++
		t.Run(c.Name, func(t *testing.T) {
			want := c.Output(t, "last_hidden_state")
			if c.HasOutput("pixel_values") {
				pv := c.Output(t, "pixel_values")
				calls := 0
				got, shape, err := enc.Model.ForwardHost(pv.F32, toInts(pv.Shape), func(int) error { calls++; return nil })
				if err != nil {
					t.Fatal(err)
				}
				if calls != enc.Model.Config.NumHiddenLayers+1 {
					t.Errorf("hook called %d times, want %d", calls, enc.Model.Config.NumHiddenLayers+1)
				}
				c.Check(t, "last_hidden_state (fixture pixel_values)", got, toInt64s(shape), want)
			}
			pix, h, w, ch := imageInput(t, c)
			got, shape, err := enc.Encode(pix, h, w, ch, nil)
			if err != nil {
				t.Fatal(err)
			}
			c.CheckTol(t, "last_hidden_state (end to end from uint8)", got, toInt64s(shape), want, endTol)
		})
	}
	if n == 0 {
		t.Fatal("no siglip.encode case")
	}
	if m := rt.Memory(); m.LiveTensors != uint64(enc.Model.NumTensors()) {
		t.Errorf("%d live tensors after the cases, want the %d weights", m.LiveTensors, enc.Model.NumTensors())
	}
}
