package imageproc

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
)

// TestPipelineImageSteps checks this package's steps of the whole-job fixture: the bucket choice
// and start-frame preparation (intermediate image_np) and the MP4 frame conversion (frames_u8 of
// the final pixels). The model stages are the workers' business.
func TestPipelineImageSteps(t *testing.T) {
	fx := parity.Load(t, "pipeline")
	n := 0
	for _, c := range fx.Cases {
		if c.Op != "pipeline.framepack_i2v" {
			continue
		}
		n++
		t.Run(c.Name, func(t *testing.T) {
			table := bucketTableFor(t, c)
			img := imageFromArray(t, c.Input(t, "image_hwc_u8"))
			b, err := FindNearestBucket(img.Height, img.Width, table)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ResizeAndCenterCrop(img, b.Width, b.Height)
			if err != nil {
				t.Fatal(err)
			}
			want := imageFromArray(t, c.Intermediate(t, "image_np"))
			if got.Width != want.Width || got.Height != want.Height {
				t.Fatalf("prepared %dx%d (bucket %v), want %dx%d", got.Width, got.Height, b, want.Width, want.Height)
			}
			md, nd := diffImages(got, want)
			t.Logf("case %s: image_np %dx%d -> bucket %dx%d: max diff %d, %d of %d differ, tolerance max diff 1 (uint8)",
				c.Name, img.Height, img.Width, b.Height, b.Width, md, nd, len(want.Pix))
			if md > 1 {
				t.Errorf("image_np max diff %d", md)
			}

			px := videoFromArray(t, c.Output(t, "pixels"))
			u8, err := PixelsToUint8(px)
			if err != nil {
				t.Fatal(err)
			}
			wantU8 := c.Output(t, "frames_u8")
			gf := make([]float32, len(u8))
			for i, v := range u8 {
				gf[i] = float32(v)
			}
			md2, nd2 := parity.MaxAbsDiff(gf, wantU8.F32)
			t.Logf("case %s: frames_u8: max diff %g, %d of %d differ, tolerance 0 (exact)", c.Name, md2, nd2, len(gf))
			if nd2 != 0 {
				t.Errorf("frames_u8: %d values differ", nd2)
			}
		})
	}
	if n == 0 {
		t.Fatal("no pipeline.framepack_i2v case")
	}
}

// TestSiglipPreprocessMatchesFixture checks the image half of SigLIP's processor (BICUBIC resize to
// the configured size, /255, (x−mean)/std) against the pixel_values of the siglip fixture; the
// encoder itself is the clipvision worker's.
func TestSiglipPreprocessMatchesFixture(t *testing.T) {
	fx := parity.Load(t, "siglip")
	dir, err := fx.ModelPath("feature_extractor")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "preprocessor_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Size          struct{ Height, Width int } `json:"size"`
		Resample      int                         `json:"resample"`
		RescaleFactor float64                     `json:"rescale_factor"`
		ImageMean     [3]float64                  `json:"image_mean"`
		ImageStd      [3]float64                  `json:"image_std"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Resample != 3 {
		t.Fatalf("resample %d: only PIL BICUBIC (3) is implemented", cfg.Resample)
	}
	n := 0
	for _, c := range fx.Cases {
		if c.Op != "siglip.encode" || !c.HasOutput("pixel_values") {
			continue
		}
		n++
		t.Run(c.Name, func(t *testing.T) {
			img := imageFromArray(t, c.Input(t, "image_hwc_u8"))
			r, err := SiglipResize(img, cfg.Size.Width, cfg.Size.Height)
			if err != nil {
				t.Fatal(err)
			}
			got := r.ToCHWFloat(cfg.RescaleFactor, cfg.ImageMean, cfg.ImageStd)
			want := c.Output(t, "pixel_values")
			rel := parity.RelL2(got, want.F32)
			md, nd := parity.MaxAbsDiff(got, want.F32)
			t.Logf("case %s: pixel_values rel_l2 %.3g, max diff %.3g, %d of %d differ, tolerance 1e-2", c.Name, rel, md, nd, len(got))
			if !(rel <= 1e-2) {
				t.Errorf("rel_l2 %g > 1e-2", rel)
			}
		})
	}
	if n == 0 {
		t.Fatal("no siglip.encode case with pixel_values")
	}
}
