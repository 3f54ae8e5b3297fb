package imageproc

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/safetensors"
)

// jpegTolerance is the accepted per-value difference from Pillow for JPEG files: Go's IDCT is not
// libjpeg's, everything after it (colour conversion, chroma upsampling, CMYK) is.
const jpegTolerance = 4

// TestDecodeMatchesPillow decodes every file of testdata/decode and compares it with what Pillow
// made of it (testdata/gen_decode.py): exact for PNG and WebP, within jpegTolerance for JPEG.
func TestDecodeMatchesPillow(t *testing.T) {
	f, err := safetensors.Open("testdata/decode_pillow.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	if err := json.Unmarshal([]byte(f.Metadata()["files"]), &names); err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatal("no files")
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "decode", name))
			if err != nil {
				t.Fatal(err)
			}
			want := readU8Image(t, f, name)
			got, meta, err := Decode(data, Options{Declared: FormatFromName(name)})
			if err != nil {
				t.Fatal(err)
			}
			if got.Width != want.Width || got.Height != want.Height {
				t.Fatalf("got %dx%d, want %dx%d (orientation %d)", got.Width, got.Height, want.Width, want.Height, meta.Orientation)
			}
			md, nd := diffImages(got, want)
			tol := 0
			if meta.Format == FormatJPEG {
				tol = jpegTolerance
			}
			t.Logf("%s: %s %s %dx%d orientation %d: max diff %d, %d of %d values differ, tolerance %d",
				name, meta.Format, meta.Source, got.Width, got.Height, meta.Orientation, md, nd, len(want.Pix), tol)
			if md > tol {
				t.Errorf("max diff %d > %d", md, tol)
			}
			if strings.Contains(name, "orient") {
				o := int(name[strings.Index(name, "orient")+6] - '0')
				if meta.Orientation != o {
					t.Errorf("orientation %d, want %d", meta.Orientation, o)
				}
			}
		})
	}
}
