package siglip

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/safetensors"
)

// texture is the deterministic input of testdata/gen_processor_golden.py.
func texture(h, w, c int) []uint8 {
	p := make([]uint8, h*w*c)
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			for ch := 0; ch < c; ch++ {
				v := x*x*3 + y*y*5 + x*y*7 + ch*91 + (x^y)*11 + (x/3)*40 + (y/5)*30
				p[(y*w+x)*c+ch] = uint8(v & 255)
			}
		}
	}
	return p
}

// TestProcessorGolden compares both backends with transformers 5.17 itself (torch 2.11,
// torchvision 0.26, Pillow 12.3; testdata/gen_processor_golden.py): the resized uint8 image must
// be identical, and for the 56 px cases the float pixel values too.
func TestProcessorGolden(t *testing.T) {
	f, err := safetensors.Open(filepath.Join("testdata", "processor_golden.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cases := []struct {
		name    string
		h, w, c int
		size    int
	}{
		{"bucket_544x704_to_384", 544, 704, 3, 384},
		{"up_17x5_to_384", 17, 5, 3, 384},
		{"mixed_200x1000_to_384", 200, 1000, 3, 384},
		{"fixture_48x64_to_56", 48, 64, 3, 56},
		{"fixture_120x90_to_56", 120, 90, 3, 56},
		{"gray_9x13_to_56", 9, 13, 1, 56},
		{"rgba_31x20_to_56", 31, 20, 4, 56},
		{"same_56", 56, 56, 3, 56},
	}
	checked := 0
	for _, tc := range cases {
		for _, b := range []Backend{BackendTorchvision, BackendPIL} {
			key := tc.name + "." + string(b) + "."
			if _, ok := f.Info(key + "resized_hwc_u8"); !ok {
				continue
			}
			t.Run(tc.name+"/"+string(b), func(t *testing.T) {
				pix := texture(tc.h, tc.w, tc.c)
				cfg := DefaultProcessorConfig()
				cfg.Height, cfg.Width = tc.size, tc.size
				raw := cfg
				raw.DoRescale, raw.DoNormalize = false, false
				p, err := NewProcessor(raw, b)
				if err != nil {
					t.Fatal(err)
				}
				got, err := p.Preprocess(pix, tc.h, tc.w, tc.c)
				if err != nil {
					t.Fatal(err)
				}
				want, shape, err := f.Float32(key + "resized_hwc_u8")
				if err != nil {
					t.Fatal(err)
				}
				if len(shape) != 3 || int(shape[0]) != tc.size || int(shape[1]) != tc.size || shape[2] != 3 {
					t.Fatalf("golden shape %v", shape)
				}
				n := tc.size * tc.size
				diff, maxd := 0, float32(0)
				for i := 0; i < n; i++ {
					for c := 0; c < 3; c++ {
						d := got[c*n+i] - want[3*i+c]
						if d < 0 {
							d = -d
						}
						if d != 0 {
							diff++
							maxd = max(maxd, d)
						}
					}
				}
				t.Logf("%s %s: %d of %d resized values differ from transformers, max %g", tc.name, b, diff, 3*n, maxd)
				if diff != 0 {
					t.Errorf("resized image differs from transformers' in %d values", diff)
				}
				if _, ok := f.Info(key + "pixel_values"); !ok {
					return
				}
				p, err = NewProcessor(cfg, b)
				if err != nil {
					t.Fatal(err)
				}
				pv, err := p.Preprocess(pix, tc.h, tc.w, tc.c)
				if err != nil {
					t.Fatal(err)
				}
				wantPV, _, err := f.Float32(key + "pixel_values")
				if err != nil {
					t.Fatal(err)
				}
				bad := 0
				for i := range wantPV {
					if pv[i] != wantPV[i] {
						bad++
					}
				}
				if bad != 0 {
					t.Errorf("%d of %d pixel values differ from transformers' (bit for bit)", bad, len(wantPV))
				}
			})
			checked++
		}
	}
	if checked < len(cases) {
		t.Fatalf("only %d golden entries found", checked)
	}
	if v := f.Metadata()["transformers"]; !strings.HasPrefix(v, "5.") {
		t.Errorf("golden data made with transformers %q", v)
	}
}
