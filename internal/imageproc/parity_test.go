package imageproc

import (
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
)

// TestParityPrep checks every case of the prep fixture against FramePack's helpers and Pillow.
func TestParityPrep(t *testing.T) {
	fx := parity.Load(t, "prep")
	if len(fx.Cases) == 0 {
		t.Fatal("prep fixture has no cases")
	}
	for _, c := range fx.Cases {
		t.Run(c.Name, func(t *testing.T) {
			switch c.Op {
			case "prep.find_nearest_bucket":
				parityBuckets(t, c)
			case "prep.resize_and_center_crop":
				parityResizeCrop(t, c)
			case "prep.soft_append_bcthw":
				paritySoftAppend(t, c)
			case "prep.pixels_to_uint8":
				parityToUint8(t, c)
			default:
				t.Fatalf("case %s: unknown op %q", c.Name, c.Op)
			}
		})
	}
}

// bucketTableFor returns the case's bucket list: params.buckets when given, else FramePack's table
// for params.resolution.
func bucketTableFor(t *testing.T, c parity.Case) []Bucket {
	t.Helper()
	var list [][2]int
	if c.Param(t, "buckets", &list) {
		table := make([]Bucket, len(list))
		for i, b := range list {
			table[i] = Bucket{Height: b[0], Width: b[1]}
		}
		return table
	}
	var res int
	if !c.Param(t, "resolution", &res) {
		t.Fatalf("case %s: neither buckets nor resolution in params", c.Name)
	}
	table, ok := BucketTable(res)
	if !ok {
		t.Fatalf("case %s: no bucket table for resolution %d", c.Name, res)
	}
	return table
}

func parityBuckets(t *testing.T, c parity.Case) {
	table := bucketTableFor(t, c)
	q := c.Input(t, "queries")
	want := c.Output(t, "buckets")
	if len(q.Shape) != 2 || q.Shape[1] != 2 || len(want.Ints) != len(q.Ints) {
		t.Fatalf("queries %v, buckets %v: want [N,2] each", q.Shape, want.Shape)
	}
	got := make([]float32, len(q.Ints))
	wrong := 0
	for i := 0; i < len(q.Ints); i += 2 {
		b, err := FindNearestBucket(int(q.Ints[i]), int(q.Ints[i+1]), table)
		if err != nil {
			t.Fatal(err)
		}
		got[i], got[i+1] = float32(b.Height), float32(b.Width)
		if int64(b.Height) != want.Ints[i] || int64(b.Width) != want.Ints[i+1] {
			wrong++
			t.Errorf("h=%d w=%d: got %dx%d, want %dx%d", q.Ints[i], q.Ints[i+1], b.Height, b.Width, want.Ints[i], want.Ints[i+1])
		}
	}
	rel := parity.RelL2(got, want.F32)
	t.Logf("case %s: %d queries, %d wrong, rel_l2 %.3g, tolerance %g (exact)", c.Name, len(q.Ints)/2, wrong, rel, c.Tolerance.RelL2)
}

func parityResizeCrop(t *testing.T, c parity.Case) {
	var th, tw int
	if !c.Param(t, "target_height", &th) || !c.Param(t, "target_width", &tw) {
		t.Fatalf("case %s: target_height/target_width missing", c.Name)
	}
	in := c.Input(t, "image_hwc_u8")
	want := c.Output(t, "image_hwc_u8")
	img := imageFromArray(t, in)
	got, err := ResizeAndCenterCrop(img, tw, th)
	if err != nil {
		t.Fatal(err)
	}
	if int64(got.Height) != want.Shape[0] || int64(got.Width) != want.Shape[1] {
		t.Fatalf("got %dx%d, want %v", got.Height, got.Width, want.Shape)
	}
	gf := make([]float32, len(got.Pix))
	for i, v := range got.Pix {
		gf[i] = float32(v)
	}
	maxDiff, differing := parity.MaxAbsDiff(gf, want.F32)
	rel := parity.RelL2(gf, want.F32)
	t.Logf("case %s: %dx%d -> %dx%d, max diff %g, %d of %d values differ, rel_l2 %.3g, tolerance max diff 1 (uint8)",
		c.Name, img.Height, img.Width, th, tw, maxDiff, differing, len(gf), rel)
	if maxDiff > 1 {
		t.Errorf("max diff %g > 1", maxDiff)
	}
}

func imageFromArray(t *testing.T, a parity.Array) *Image {
	t.Helper()
	if len(a.Shape) != 3 || a.Shape[2] != 3 || a.Ints == nil {
		t.Fatalf("%s: want uint8 [H,W,3], got %s %v", a.Key, a.DType, a.Shape)
	}
	pix := make([]uint8, len(a.Ints))
	for i, v := range a.Ints {
		pix[i] = uint8(v)
	}
	m, err := FromHWC(pix, int(a.Shape[0]), int(a.Shape[1]))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func videoFromArray(t *testing.T, a parity.Array) Video {
	t.Helper()
	if len(a.Shape) != 5 {
		t.Fatalf("%s: want [B,C,T,H,W], got %v", a.Key, a.Shape)
	}
	s := a.Shape
	return Video{B: int(s[0]), C: int(s[1]), T: int(s[2]), H: int(s[3]), W: int(s[4]), Data: a.F32}
}

func paritySoftAppend(t *testing.T, c parity.Case) {
	var overlap int
	if !c.Param(t, "overlap", &overlap) {
		t.Fatalf("case %s: no overlap param", c.Name)
	}
	h := videoFromArray(t, c.Input(t, "history"))
	cur := videoFromArray(t, c.Input(t, "current"))
	want := c.Output(t, "out")
	got, err := SoftAppend(h, cur, overlap)
	if err != nil {
		t.Fatal(err)
	}
	s := got.Shape()
	for i := range s {
		if int64(s[i]) != want.Shape[i] {
			t.Fatalf("shape %v, want %v", s, want.Shape)
		}
	}
	rel := parity.RelL2(got.Data, want.F32)
	t.Logf("case %s: rel_l2 %.3g, tolerance %g", c.Name, rel, c.Tolerance.RelL2)
	if !(rel <= c.Tolerance.RelL2) {
		t.Errorf("rel_l2 %g > %g", rel, c.Tolerance.RelL2)
	}
}

func parityToUint8(t *testing.T, c parity.Case) {
	v := videoFromArray(t, c.Input(t, "pixels"))
	want := c.Output(t, "frames_u8")
	got, err := PixelsToUint8(v)
	if err != nil {
		t.Fatal(err)
	}
	gf := make([]float32, len(got))
	for i, x := range got {
		gf[i] = float32(x)
	}
	maxDiff, differing := parity.MaxAbsDiff(gf, want.F32)
	t.Logf("case %s: max diff %g, %d of %d differ, rel_l2 %.3g, tolerance %g (exact)",
		c.Name, maxDiff, differing, len(gf), parity.RelL2(gf, want.F32), c.Tolerance.RelL2)
	if differing != 0 {
		t.Errorf("%d values differ (max %g)", differing, maxDiff)
	}
	// The MP4 layout of the same data must hold the same values.
	f, err := VideoFrames(v)
	if err != nil {
		t.Fatal(err)
	}
	if v.B == 1 {
		for ch := 0; ch < v.C; ch++ {
			for tt := 0; tt < v.T; tt++ {
				for i := 0; i < v.H*v.W; i++ {
					if a, b := f.Pix[(tt*v.H*v.W+i)*v.C+ch], got[((ch*v.T)+tt)*v.H*v.W+i]; a != b {
						t.Fatalf("frames [t=%d i=%d c=%d] = %d, elementwise %d", tt, i, ch, a, b)
					}
				}
			}
		}
	}
}
