package imageproc

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/framepackd/framepackd/internal/safetensors"
)

type pillowCase struct {
	Key          string      `json:"key"`
	Op           string      `json:"op"`
	Filter       string      `json:"filter"`
	Width        int         `json:"width"`
	Height       int         `json:"height"`
	Box          *[4]float32 `json:"box"`
	TargetWidth  int         `json:"target_width"`
	TargetHeight int         `json:"target_height"`
}

func readU8Image(t *testing.T, f *safetensors.File, name string) *Image {
	t.Helper()
	info, ok := f.Info(name)
	if !ok || len(info.Shape) != 3 || info.Shape[2] != 3 {
		t.Fatalf("%s: missing or not [H,W,3]", name)
	}
	raw, err := f.Bytes(name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := FromHWC(append([]uint8(nil), raw...), int(info.Shape[0]), int(info.Shape[1]))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func diffImages(got, want *Image) (maxDiff, differing int) {
	for i := range want.Pix {
		d := int(got.Pix[i]) - int(want.Pix[i])
		if d < 0 {
			d = -d
		}
		if d != 0 {
			differing++
		}
		maxDiff = max(maxDiff, d)
	}
	return
}

// TestResampleMatchesPillow compares Resize, ResizeBox and ResizeAndCenterCrop with outputs that
// Pillow itself produced (testdata/gen_resample.py): noise and smooth images, up- and downscaling,
// boxes, 1-pixel sources, odd crop sizes.
func TestResampleMatchesPillow(t *testing.T) {
	f, err := safetensors.Open("testdata/resample_pillow.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cases []pillowCase
	if err := json.Unmarshal([]byte(f.Metadata()["cases"]), &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Fatal("no cases")
	}
	total, totalDiff := 0, 0
	for _, c := range cases {
		name := fmt.Sprintf("%s_%s_%s", c.Key, c.Op, c.Filter)
		t.Run(name, func(t *testing.T) {
			in := readU8Image(t, f, c.Key+".in")
			want := readU8Image(t, f, c.Key+".out")
			var got *Image
			var err error
			switch c.Op {
			case "resize":
				filter := map[string]Filter{"lanczos": Lanczos, "bicubic": Bicubic}[c.Filter]
				if c.Box != nil {
					got, err = ResizeBox(in, c.Width, c.Height, filter, Box{c.Box[0], c.Box[1], c.Box[2], c.Box[3]})
				} else {
					got, err = Resize(in, c.Width, c.Height, filter)
				}
			case "resize_and_center_crop":
				got, err = ResizeAndCenterCrop(in, c.TargetWidth, c.TargetHeight)
			default:
				t.Fatalf("unknown op %q", c.Op)
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Width != want.Width || got.Height != want.Height {
				t.Fatalf("got %dx%d, want %dx%d", got.Width, got.Height, want.Width, want.Height)
			}
			md, nd := diffImages(got, want)
			total += len(want.Pix)
			totalDiff += nd
			if md > 1 {
				t.Errorf("%dx%d -> %dx%d: max diff %d, %d values differ", in.Width, in.Height, got.Width, got.Height, md, nd)
			}
		})
	}
	t.Logf("%d cases, %d of %d values differ from Pillow", len(cases), totalDiff, total)
}

func TestCenterCropBoxRounding(t *testing.T) {
	tests := []struct {
		name           string
		w, h, tw, th   int
		x0, y0, x1, y1 int
	}{
		{"even", 100, 80, 96, 64, 2, 8, 98, 72},
		{"half rounds to even", 97, 80, 96, 64, 0, 8, 96, 72},
		{"half rounds up to even", 99, 80, 96, 64, 2, 8, 98, 72},
		{"odd target widens", 6, 6, 5, 6, 0, 0, 6, 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x0, y0, x1, y1 := CenterCropBox(tt.w, tt.h, tt.tw, tt.th)
			if x0 != tt.x0 || y0 != tt.y0 || x1 != tt.x1 || y1 != tt.y1 {
				t.Errorf("got (%d,%d,%d,%d), want (%d,%d,%d,%d)", x0, y0, x1, y1, tt.x0, tt.y0, tt.x1, tt.y1)
			}
		})
	}
}

func TestFindNearestBucketTies(t *testing.T) {
	table := []Bucket{{64, 96}, {80, 80}, {96, 64}}
	// A square image is nearest to 80x80 only.
	if b, _ := FindNearestBucket(50, 50, table); b != (Bucket{80, 80}) {
		t.Errorf("square: got %v", b)
	}
	// Equal metrics: the later bucket wins, as in FramePack's `<=`.
	tie := []Bucket{{10, 20}, {20, 10}}
	if b, _ := FindNearestBucket(1, 1, tie); b != (Bucket{20, 10}) {
		t.Errorf("tie: got %v, want the later bucket", b)
	}
	if _, err := FindNearestBucket(1, 1, nil); err == nil {
		t.Error("empty table: want an error")
	}
	t640, ok := BucketTable(640)
	if !ok || len(t640) != 14 {
		t.Fatalf("640 table: %v %v", ok, t640)
	}
	if b, _ := FindNearestBucket(1080, 1920, t640); b != (Bucket{480, 832}) {
		t.Errorf("1080p: got %v", b)
	}
}
