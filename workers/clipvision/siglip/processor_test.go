package siglip

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/imageproc"
)

func TestParseProcessorConfig(t *testing.T) {
	tests := []struct {
		name  string
		raw   string
		check func(ProcessorConfig) bool
		want  string // error substring; "" for success
	}{
		{"defaults", `{}`, func(c ProcessorConfig) bool {
			return c == DefaultProcessorConfig()
		}, ""},
		{"flux redux", `{"do_convert_rgb": null, "do_normalize": true, "do_rescale": true, "do_resize": true,
		  "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "SiglipImageProcessor", "image_std": [0.5, 0.5, 0.5],
		  "processor_class": "SiglipProcessor", "resample": 3, "rescale_factor": 0.00392156862745098,
		  "size": {"height": 384, "width": 384}}`, func(c ProcessorConfig) bool {
			return c.Height == 384 && c.Width == 384 && c.DoConvertRGB && c.RescaleFactor == 0.00392156862745098
		}, ""},
		{"scalar mean and std", `{"image_mean": 0.25, "image_std": 2, "size": {"height": 7, "width": 9}, "do_convert_rgb": false}`,
			func(c ProcessorConfig) bool {
				return c.ImageMean == [3]float64{0.25, 0.25, 0.25} && c.ImageStd == [3]float64{2, 2, 2} &&
					c.Height == 7 && c.Width == 9 && !c.DoConvertRGB
			}, ""},
		{"shortest edge", `{"size": {"shortest_edge": 384}}`, nil, "want {\"height\", \"width\"}"},
		{"bilinear", `{"resample": 2}`, nil, "resample 2 is not supported"},
		{"zero std", `{"image_std": [0.5, 0, 0.5]}`, nil, "std must be finite and nonzero"},
		{"two means", `{"image_mean": [0.5, 0.5]}`, nil, "image_mean must be a number or a list of 3 numbers"},
		{"zero size", `{"size": {"height": 0, "width": 4}}`, nil, "must be positive"},
		{"other processor", `{"image_processor_type": "CLIPImageProcessor"}`, nil, "is not a SiglipImageProcessor"},
		{"not json", `{`, nil, "unexpected end"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseProcessorConfig([]byte(tc.raw))
			if tc.want != "" {
				if err == nil || !errors.Is(err, ErrCheckpoint) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err %v, want ErrCheckpoint with %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Fatalf("config %+v", c)
			}
		})
	}
}

func TestParseBackend(t *testing.T) {
	for in, want := range map[string]Backend{"": BackendTorchvision, "torchvision": BackendTorchvision, "pil": BackendPIL} {
		if got, err := ParseBackend(in); err != nil || got != want {
			t.Errorf("ParseBackend(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseBackend("opencv"); err == nil {
		t.Error("ParseBackend(opencv) succeeded")
	}
}

func randomPix(r *rand.Rand, n int) []uint8 {
	p := make([]uint8, n)
	for i := range p {
		p[i] = uint8(r.IntN(256))
	}
	return p
}

// TestTorchResizeAgainstPillow cross-checks the two resamplers, written independently: PyTorch's
// uint8 antialiased bicubic and Pillow's BICUBIC are the same filter with different weight
// precision, so they differ by a level on a minority of pixels — by two where an upscale's
// vertical taps (weights above 1 and below 0) add two rounding differences of the horizontal pass;
// transformers itself shows the same (17×5 → 384²: max 2, 3010 of 442368 values).
func TestTorchResizeAgainstPillow(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	sizes := [][4]int{{48, 64, 56, 56}, {120, 90, 56, 56}, {17, 5, 384, 384}, {1000, 700, 384, 384},
		{3, 3, 4, 9}, {384, 384, 384, 200}, {2, 900, 14, 14}}
	for _, s := range sizes {
		h, w, oh, ow := s[0], s[1], s[2], s[3]
		// a smooth image with noise: resampling differences show on both
		pix := make([]uint8, h*w*3)
		for y := 0; y < h; y++ {
			for x := 0; x < w; x++ {
				for c := 0; c < 3; c++ {
					v := 128 + 100*math.Sin(float64(x)/7+float64(c))*math.Cos(float64(y)/5) + 20*r.NormFloat64()
					pix[(y*w+x)*3+c] = uint8(max(0, min(255, math.Round(v))))
				}
			}
		}
		img := &imageproc.Image{Width: w, Height: h, Pix: pix}
		a, err := TorchResizeBicubic(img, ow, oh)
		if err != nil {
			t.Fatal(err)
		}
		b, err := imageproc.Resize(img, ow, oh, imageproc.Bicubic)
		if err != nil {
			t.Fatal(err)
		}
		maxd, nd := 0, 0
		for i := range a.Pix {
			d := int(a.Pix[i]) - int(b.Pix[i])
			if d < 0 {
				d = -d
			}
			maxd = max(maxd, d)
			if d != 0 {
				nd++
			}
		}
		t.Logf("%dx%d -> %dx%d: %d of %d values differ from Pillow, max %d", h, w, oh, ow, nd, len(a.Pix), maxd)
		if maxd > 2 || nd > len(a.Pix)/4 {
			t.Errorf("%dx%d -> %dx%d: max diff %d, %d of %d differ", h, w, oh, ow, maxd, nd, len(a.Pix))
		}
	}
}

// TestTorchAxisWeights checks the int16 quantisation: the precision keeps the largest weight
// below 2^15, every window sums to about 2^precision, and upsampling uses 4 taps.
func TestTorchAxisWeights(t *testing.T) {
	for _, s := range [][2]int{{48, 56}, {64, 56}, {1, 384}, {4000, 384}, {384, 384}, {7, 3}} {
		ax := torchAxisWeights(s[0], s[1])
		for i := 0; i < s[1]; i++ {
			var sum int32
			for _, w := range ax.w[i*ax.ksize : i*ax.ksize+ax.size[i]] {
				if w >= 1<<15 || w < -(1<<15) {
					t.Fatalf("%v: weight %d out of int16", s, w)
				}
				sum += w
			}
			if d := sum - int32(1)<<ax.precision; d < -int32(ax.size[i]) || d > int32(ax.size[i]) {
				t.Fatalf("%v output %d: weights sum to %d, want 2^%d", s, i, sum, ax.precision)
			}
			if ax.xmin[i] < 0 || ax.xmin[i]+ax.size[i] > s[0] {
				t.Fatalf("%v output %d: window [%d, +%d) outside the input", s, i, ax.xmin[i], ax.size[i])
			}
		}
		if s[0] < s[1] && s[0] >= 4 && ax.ksize != 5 {
			t.Errorf("%v: upsampling kernel size %d", s, ax.ksize)
		}
		if ax.precision < 13 || ax.precision > 22 {
			t.Errorf("%v: precision %d", s, ax.precision)
		}
	}
}

func TestTorchResizeIdentityAndConstant(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	img := &imageproc.Image{Width: 5, Height: 4, Pix: randomPix(r, 60)}
	same, err := TorchResizeBicubic(img, 5, 4)
	if err != nil {
		t.Fatal(err)
	}
	if string(same.Pix) != string(img.Pix) || &same.Pix[0] == &img.Pix[0] {
		t.Error("same-size resize is not an equal copy")
	}
	flat := imageproc.NewImage(9, 13)
	for i := range flat.Pix {
		flat.Pix[i] = uint8(37 + i%3)
	}
	for _, sz := range [][2]int{{1, 1}, {56, 56}, {3, 40}} {
		out, err := TorchResizeBicubic(flat, sz[0], sz[1])
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range out.Pix {
			if v != uint8(37+i%3) {
				t.Fatalf("constant image resized to %v: value %d at %d", sz, v, i)
			}
		}
	}
	if _, err := TorchResizeBicubic(img, 0, 3); err == nil {
		t.Error("resize to width 0 succeeded")
	}
	if _, err := TorchResizeBicubic(&imageproc.Image{Width: 2, Height: 2, Pix: make([]uint8, 5)}, 3, 3); err == nil {
		t.Error("resize of a short buffer succeeded")
	}
}

// TestPreprocessOddImages covers the valid inputs the worker must take: 1×1, grayscale (L and
// LA) and RGBA, with both backends.
func TestPreprocessOddImages(t *testing.T) {
	cfg := DefaultProcessorConfig()
	cfg.Height, cfg.Width = 14, 10
	r := rand.New(rand.NewPCG(5, 6))
	for _, b := range []Backend{BackendTorchvision, BackendPIL} {
		p, err := NewProcessor(cfg, b)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(string(b)+"/1x1", func(t *testing.T) {
			out, err := p.Preprocess([]uint8{255, 0, 51}, 1, 1, 3)
			if err != nil {
				t.Fatal(err)
			}
			n := 14 * 10
			for c, want := range []float32{1, -1, -0.6} {
				for _, v := range out[c*n : (c+1)*n] {
					if math.Abs(float64(v-want)) > 1e-6 {
						t.Fatalf("channel %d: %g, want %g", c, v, want)
					}
				}
			}
		})
		t.Run(string(b)+"/gray", func(t *testing.T) {
			gray := randomPix(r, 20*30)
			out, err := p.Preprocess(gray, 20, 30, 1)
			if err != nil {
				t.Fatal(err)
			}
			rgb := make([]uint8, 0, 3*len(gray))
			la := make([]uint8, 0, 2*len(gray))
			for _, v := range gray {
				rgb = append(rgb, v, v, v)
				la = append(la, v, uint8(r.IntN(256)))
			}
			want, err := p.Preprocess(rgb, 20, 30, 3)
			if err != nil {
				t.Fatal(err)
			}
			gotLA, err := p.Preprocess(la, 20, 30, 2)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if out[i] != want[i] || gotLA[i] != want[i] {
					t.Fatalf("gray differs from its RGB at %d", i)
				}
			}
		})
		t.Run(string(b)+"/rgba", func(t *testing.T) {
			rgba := randomPix(r, 7*9*4)
			rgb := make([]uint8, 0, 7*9*3)
			for i := 0; i < 7*9; i++ {
				rgb = append(rgb, rgba[4*i:4*i+3]...)
			}
			got, err := p.Preprocess(rgba, 7, 9, 4)
			if err != nil {
				t.Fatal(err)
			}
			want, err := p.Preprocess(rgb, 7, 9, 3)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("rgba differs from its rgb at %d (alpha must be dropped)", i)
				}
			}
		})
	}
}

func TestPreprocessBadInput(t *testing.T) {
	p, err := NewProcessor(DefaultProcessorConfig(), "")
	if err != nil {
		t.Fatal(err)
	}
	noRGB := DefaultProcessorConfig()
	noRGB.DoConvertRGB = false
	pNoRGB, err := NewProcessor(noRGB, BackendPIL)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		p       *Processor
		pix     []uint8
		h, w, c int
	}{
		{"empty", p, nil, 0, 0, 3},
		{"zero height", p, nil, 0, 5, 3},
		{"negative width", p, nil, 2, -1, 3},
		{"5 channels", p, make([]uint8, 20), 2, 2, 5},
		{"0 channels", p, nil, 2, 2, 0},
		{"short buffer", p, make([]uint8, 11), 2, 2, 3},
		{"long buffer", p, make([]uint8, 13), 2, 2, 3},
		{"huge", p, nil, 1 << 20, 1 << 20, 3},
		{"gray without do_convert_rgb", pNoRGB, make([]uint8, 4), 2, 2, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.p.Preprocess(tc.pix, tc.h, tc.w, tc.c); !errors.Is(err, ErrBadInput) {
				t.Fatalf("err %v, want ErrBadInput", err)
			}
		})
	}
}

// TestNormalizeVariants checks the rescale/normalise combinations of both backends on values
// whose results are exact.
func TestNormalizeVariants(t *testing.T) {
	pix := []uint8{0, 51, 255}
	tests := []struct {
		name               string
		rescale, normalize bool
		want               []float32
	}{
		{"both", true, true, []float32{-1, -0.6, 1}},
		{"rescale only", true, false, []float32{0, 0.2, 1}},
		{"normalize only", false, true, []float32{-0.5 / 0.5, 50.5 / 0.5, 254.5 / 0.5}},
		{"neither", false, false, []float32{0, 51, 255}},
	}
	for _, tc := range tests {
		for _, b := range []Backend{BackendTorchvision, BackendPIL} {
			cfg := DefaultProcessorConfig()
			cfg.DoResize, cfg.DoRescale, cfg.DoNormalize = false, tc.rescale, tc.normalize
			p, err := NewProcessor(cfg, b)
			if err != nil {
				t.Fatal(err)
			}
			out, err := p.Preprocess(pix, 1, 1, 3)
			if err != nil {
				t.Fatal(err)
			}
			for i, w := range tc.want {
				if math.Abs(float64(out[i]-w)) > 1e-6*math.Max(1, math.Abs(float64(w))) {
					t.Errorf("%s/%s: channel %d = %g, want %g", tc.name, b, i, out[i], w)
				}
			}
		}
	}
}
