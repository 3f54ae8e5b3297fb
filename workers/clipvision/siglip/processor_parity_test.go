package siglip

import (
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
)

// processorFor reads the fixture set's preprocessor config.
func processorFor(t *testing.T, fx *parity.Fixture, b Backend) *Processor {
	t.Helper()
	dir, err := fx.ModelPath("feature_extractor")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadProcessorConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewProcessor(cfg, b)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func imageInput(t *testing.T, c parity.Case) ([]uint8, int, int, int) {
	t.Helper()
	a := c.Input(t, "image_hwc_u8")
	if len(a.Shape) != 3 {
		t.Fatalf("case %s: image_hwc_u8 shape %v", c.Name, a.Shape)
	}
	pix := make([]uint8, len(a.Ints))
	for i, v := range a.Ints {
		pix[i] = uint8(v)
	}
	return pix, int(a.Shape[0]), int(a.Shape[1]), int(a.Shape[2])
}

// pixelTolerance is the bound for pixel_values (the fixture's note allows 1e-2).
const pixelTolerance = 1e-3

// TestParitySiglipPixelValues checks the processor against the fixture's pixel_values with both
// backends: torchvision (transformers 5, which made the fixture) within 1e-3, and logs the PIL
// path's distance for the record.
func TestParitySiglipPixelValues(t *testing.T) {
	fx := parity.Load(t, "siglip")
	n := 0
	for _, c := range fx.Cases {
		if c.Op != "siglip.encode" || !c.HasOutput("pixel_values") {
			continue
		}
		n++
		t.Run(c.Name, func(t *testing.T) {
			pix, h, w, ch := imageInput(t, c)
			want := c.Output(t, "pixel_values")
			for _, b := range []Backend{BackendTorchvision, BackendPIL} {
				p := processorFor(t, fx, b)
				got, err := p.Preprocess(pix, h, w, ch)
				if err != nil {
					t.Fatal(err)
				}
				oh, ow := p.OutputSize(h, w)
				md, nd := parity.MaxAbsDiff(got, want.F32)
				if b == BackendTorchvision {
					c.CheckTol(t, "pixel_values", got, []int64{1, 3, int64(oh), int64(ow)}, want, pixelTolerance)
					t.Logf("case %s pixel_values (%s): max diff %.3g, %d of %d differ", c.Name, b, md, nd, len(got))
				} else {
					t.Logf("case %s pixel_values (%s, informational): rel_l2=%.3g max diff %.3g, %d of %d differ",
						c.Name, b, parity.RelL2(got, want.F32), md, nd, len(got))
				}
			}
		})
	}
	if n == 0 {
		t.Fatal("no siglip.encode case with pixel_values")
	}
}
