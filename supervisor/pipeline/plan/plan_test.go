package plan

import (
	"math"
	"slices"
	"testing"

	"github.com/framepackd/framepackd/internal/imageproc"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

func TestPaddings(t *testing.T) {
	tests := []struct {
		n    int
		want []int
	}{
		{0, []int{0}}, {1, []int{0}}, {2, []int{1, 0}}, {4, []int{3, 2, 1, 0}},
		{5, []int{3, 2, 2, 1, 0}}, {8, []int{3, 2, 2, 2, 2, 2, 1, 0}},
	}
	for _, tc := range tests {
		if got := Paddings(tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("Paddings(%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

func seq(from, to int64) []int64 {
	var out []int64
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

func TestSectionIndices(t *testing.T) {
	// torch.arange(0, 1+3+3+1+2+16).split([1, 3, 3, 1, 2, 16]) for padding 1, window 3.
	got := SectionIndices(1, 3)
	if !slices.Equal(got.Latent, []int64{4, 5, 6}) || !slices.Equal(got.Clean, []int64{0, 7}) ||
		!slices.Equal(got.Clean2x, []int64{8, 9}) || !slices.Equal(got.Clean4x, seq(10, 26)) {
		t.Fatalf("indices %+v", got)
	}
	// Last section, window 9: no blank frames.
	got = SectionIndices(0, 9)
	if !slices.Equal(got.Latent, seq(1, 10)) || !slices.Equal(got.Clean, []int64{0, 10}) ||
		!slices.Equal(got.Clean2x, []int64{11, 12}) || !slices.Equal(got.Clean4x, seq(13, 29)) {
		t.Fatalf("indices %+v", got)
	}
	if Frames(9) != 33 || Overlap(9) != 33 || DecodeFrames(9, false) != 18 || DecodeFrames(9, true) != 19 {
		t.Fatal("frame counts")
	}
}

func TestBuckets(t *testing.T) {
	b := func(h, w uint32) *framepackv1.Bucket { return &framepackv1.Bucket{Height: h, Width: w} }
	tests := []struct {
		name   string
		spec   *framepackv1.JobSpec
		fields []string
		first  imageproc.Bucket
		n      int
	}{
		{name: "640", spec: &framepackv1.JobSpec{Resolution: 640}, first: imageproc.Bucket{Height: 416, Width: 960}, n: 14},
		{name: "tiny", spec: &framepackv1.JobSpec{Resolution: TinyResolution}, first: imageproc.Bucket{Height: 64, Width: 96}, n: 3},
		{name: "unknown", spec: &framepackv1.JobSpec{Resolution: 512}, fields: []string{"spec.resolution"}},
		{name: "given", spec: &framepackv1.JobSpec{Resolution: 96, Buckets: []*framepackv1.Bucket{b(32, 48), b(48, 32)}},
			first: imageproc.Bucket{Height: 32, Width: 48}, n: 2},
		{name: "given without resolution", spec: &framepackv1.JobSpec{Buckets: []*framepackv1.Bucket{b(32, 48)}},
			first: imageproc.Bucket{Height: 32, Width: 48}, n: 1},
		{name: "bad sides", spec: &framepackv1.JobSpec{Resolution: 5000, Buckets: []*framepackv1.Bucket{b(30, 48), b(48, 0), b(4096, 64)}},
			fields: []string{"spec.buckets[0].height", "spec.buckets[1].width", "spec.buckets[2].height", "spec.resolution"}},
		{name: "too many", spec: &framepackv1.JobSpec{Buckets: slices.Repeat([]*framepackv1.Bucket{b(64, 64)}, MaxBuckets+1)},
			fields: []string{"spec.buckets"}},
	}
	// A submitted spec may leave the resolution 0 (the API fills in 640); the pipeline's
	// table comes only from a spec with its defaults.
	if v := CheckBuckets(&framepackv1.JobSpec{}); len(v) > 0 {
		t.Errorf("resolution 0 refused at submit: %v", v)
	}
	if _, err := Buckets(&framepackv1.JobSpec{}); err == nil {
		t.Error("Buckets of a spec without defaults chose a table")
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var fields []string
			for _, v := range CheckBuckets(tc.spec) {
				fields = append(fields, v.Field)
			}
			if !slices.Equal(fields, tc.fields) {
				t.Fatalf("violations %v, want %v", fields, tc.fields)
			}
			got, err := Buckets(tc.spec)
			if len(tc.fields) > 0 {
				if err == nil {
					t.Fatal("Buckets accepted a bad spec")
				}
				return
			}
			if err != nil || len(got) != tc.n || got[0] != tc.first {
				t.Fatalf("Buckets = %v, %v", got, err)
			}
		})
	}
}

func TestTotalSections(t *testing.T) {
	for _, tc := range []struct {
		seconds float32
		window  uint32
		want    int
	}{
		{5, 9, 4},     // 4.17
		{1, 9, 1},     // 0.83
		{0.1, 9, 1},   // max(…, 1)
		{3, 9, 2},     // 2.5 rounds to even
		{4.2, 9, 4},   // 3.5 rounds to even
		{120, 9, 100}, // the longest job
		{120, 1, 900},
		{2, 33, 0 + 1}, // 0.45
		{5, 0, 1},      // no window: a spec without its defaults
	} {
		got := TotalSections(&framepackv1.JobSpec{TotalSecondLength: tc.seconds, LatentWindowSize: tc.window})
		if got != tc.want {
			t.Errorf("%g s, window %d: %d sections, want %d", tc.seconds, tc.window, got, tc.want)
		}
	}
	if got := TotalSections(&framepackv1.JobSpec{TotalSecondLength: float32(math.NaN())}); got != 1 {
		t.Errorf("NaN: %d", got)
	}
}
