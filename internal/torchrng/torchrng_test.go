package torchrng

import (
	"bytes"
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
)

// The C++ standard pins std::mt19937 (same initialisation as at::mt19937): seeded with 5489, its
// 10000th output is 4123659995, and its first is 3499211612.
func TestMT19937KnownValues(t *testing.T) {
	g := New(5489)
	if got := g.Uint32(); got != 3499211612 {
		t.Fatalf("first draw %d, want 3499211612", got)
	}
	var last uint32
	for i := 1; i < 10000; i++ {
		last = g.Uint32()
	}
	if last != 4123659995 {
		t.Fatalf("10000th draw %d, want 4123659995", last)
	}
}

func TestSeedUsesLow32Bits(t *testing.T) {
	a, b := New(123456789012), New(123456789012&0xffffffff)
	for i := 0; i < 1000; i++ {
		if x, y := a.Uint32(), b.Uint32(); x != y {
			t.Fatalf("draw %d: %d vs %d", i, x, y)
		}
	}
	if a.InitialSeed() != 123456789012 {
		t.Fatalf("initial seed %d", a.InitialSeed())
	}
}

func TestSeedFromInt(t *testing.T) {
	for _, tc := range []struct {
		in   int64
		want uint64
	}{{0, 0}, {31337, 31337}, {-1, 0xffff_ffff_ffff_fffe}, {math.MinInt64, 0x7fff_ffff_ffff_ffff}} {
		if got := SeedFromInt(tc.in); got != tc.want {
			t.Errorf("SeedFromInt(%d) = %#x, want %#x", tc.in, got, tc.want)
		}
	}
}

func TestUint64IsHighWordFirst(t *testing.T) {
	a, b := New(7), New(7)
	hi, lo := a.Uint32(), a.Uint32()
	if got := b.Uint64(); got != uint64(hi)<<32|uint64(lo) {
		t.Fatalf("Uint64 %#x, want %#x", got, uint64(hi)<<32|uint64(lo))
	}
}

// The scalar path caches the second Box-Muller value in the generator, so two small draws
// continue one stream: randn(7) then randn(3) equals randn(10).
func TestScalarPathCachesSecondNormal(t *testing.T) {
	g := New(31337)
	a, _ := g.Randn([]int{7})
	b, _ := g.Randn([]int{3})
	want, _ := New(31337).Randn([]int{10})
	if got := append(a, b...); !slices.Equal(got, want) {
		t.Fatalf("randn(7)+randn(3) = %v, want %v", got, want)
	}
	// randn(8) uses four pairs and leaves nothing cached: the next draw starts a new pair.
	g = New(5)
	g.Randn([]int{8})
	if g.normalValid {
		t.Fatal("an even scalar draw left a cached normal")
	}
}

// A size that is not a multiple of 16 draws 16 fresh uniforms for the last 16 elements.
func TestTailRecomputesLast16(t *testing.T) {
	const seed = 99
	got, err := New(seed).Randn([]int{4, 5})
	if err != nil {
		t.Fatal(err)
	}
	head, _ := New(seed).Randn([]int{16})
	if !slices.Equal(got[:4], head[:4]) {
		t.Fatalf("first 4 %v, want %v", got[:4], head[:4])
	}
	g := New(seed)
	for i := 0; i < 20; i++ {
		g.Uint32()
	}
	tail := make([]float32, 16)
	for i := range tail {
		tail[i] = g.uniformFloat32()
	}
	normalFill16(tail)
	if !slices.Equal(got[4:], tail) {
		t.Fatalf("last 16 %v, want %v", got[4:], tail)
	}
	// 20 + 16 draws consumed: the generators agree afterwards.
	g2 := New(seed)
	g2.Randn([]int{20})
	if a, b := g.Uint32(), g2.Uint32(); a != b {
		t.Fatalf("generator after randn(20) drew %d, want %d", b, a)
	}
}

func TestRandnShapes(t *testing.T) {
	g := New(1)
	if v, err := g.Randn(nil); err != nil || len(v) != 1 {
		t.Fatalf("scalar: %v %v", v, err)
	}
	if v, err := g.Randn([]int{3, 0}); err != nil || len(v) != 0 {
		t.Fatalf("empty: %v %v", v, err)
	}
	if _, err := g.Randn([]int{2, -1}); !errors.Is(err, ErrBadShape) {
		t.Fatalf("negative dim: %v", err)
	}
	if _, err := g.Randn([]int{1 << 30, 1 << 30, 1 << 30}); !errors.Is(err, ErrBadShape) {
		t.Fatalf("overflow: %v", err)
	}
}

// Saving the state in the middle of a job and restoring it (in another generator, as another
// worker process would) continues the identical stream, including a cached normal and a twist.
func TestStateSaveRestoreMidStream(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before [][]int
	}{
		{"fresh", nil},
		{"after a section", [][]int{{1, 16, 9, 24, 40}}},
		{"cached normal", [][]int{{1, 16, 3, 8, 12}, {7}}},
		{"tail and twist", [][]int{{5, 125}, {3}, {621}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := New(31337)
			for _, s := range tc.before {
				if _, err := g.Randn(s); err != nil {
					t.Fatal(err)
				}
			}
			saved, err := g.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			if len(saved) != StateSize {
				t.Fatalf("state is %d bytes, want %d", len(saved), StateSize)
			}
			want := drawSequence(t, g)

			r := New(0)
			if err := r.UnmarshalBinary(saved); err != nil {
				t.Fatal(err)
			}
			if r.InitialSeed() != 31337 {
				t.Fatalf("restored seed %d", r.InitialSeed())
			}
			again, _ := r.MarshalBinary()
			if !bytes.Equal(again, saved) {
				t.Fatal("restored state marshals differently")
			}
			if got := drawSequence(t, r); !slices.Equal(got, want) {
				t.Fatal("restored generator draws a different stream")
			}
		})
	}
}

// drawSequence returns the bits of a mix of small, tailed and large draws and raw words.
func drawSequence(t *testing.T, g *Generator) []uint32 {
	t.Helper()
	var out []uint32
	for _, s := range [][]int{{5}, {1, 16, 3, 8, 12}, {3}, {40}, {1}} {
		v, err := g.Randn(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range v {
			out = append(out, math.Float32bits(x))
		}
	}
	for i := 0; i < 700; i++ {
		out = append(out, g.Uint32())
	}
	return out
}

func TestUnmarshalRejectsBadState(t *testing.T) {
	good, _ := New(3).MarshalBinary()
	mutate := func(f func(b []byte) []byte) []byte { return f(slices.Clone(good)) }
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"short", good[:len(good)-1]},
		{"magic", mutate(func(b []byte) []byte { b[0] = 'X'; return b })},
		{"version", mutate(func(b []byte) []byte { b[4] = 9; return b })},
		{"left zero", mutate(func(b []byte) []byte { b[13], b[14] = 0, 0; return b })},
		{"next past end", mutate(func(b []byte) []byte { b[13], b[17], b[18] = 2, 0x70, 0x02; return b })},
		{"normal flag", mutate(func(b []byte) []byte { b[StateSize-9] = 2; return b })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := New(11)
			before, _ := g.MarshalBinary()
			if err := g.UnmarshalBinary(tc.b); !errors.Is(err, ErrInvalidState) {
				t.Fatalf("err %v, want ErrInvalidState", err)
			}
			after, _ := g.MarshalBinary()
			if !bytes.Equal(before, after) {
				t.Fatal("a failed restore changed the generator")
			}
		})
	}
}

// Any state that restores must be safe to draw from (no out-of-range read).
func FuzzUnmarshalBinary(f *testing.F) {
	good, _ := New(3).MarshalBinary()
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) {
		g := New(0)
		if g.UnmarshalBinary(b) != nil {
			return
		}
		for i := 0; i < 2*stateN; i++ {
			g.Uint32()
		}
	})
}

// fma32 must round a*b+c once, as the hardware does; compare with exact big.Float arithmetic,
// including sums built to land halfway between two floats after a float64 rounding.
func TestFMA32RoundsOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(a, b, c float32) {
		t.Helper()
		exact := new(big.Float).SetPrec(400).Mul(big.NewFloat(float64(a)).SetPrec(400), big.NewFloat(float64(b)))
		exact.Add(exact, big.NewFloat(float64(c)))
		want, _ := exact.Float32()
		if got := fma32(a, b, c); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("fma32(%g, %g, %g) = %g, want %g", a, b, c, got, want)
		}
	}
	for i := 0; i < 20000; i++ {
		a := float32(rng.NormFloat64())
		b := float32(rng.NormFloat64())
		c := float32(rng.NormFloat64())
		check(a, b, c)
		check(a, b, -float32(a*b)) // cancellation
	}
	// 1 + 2^-24 is halfway between 1 and 1+2^-23; a tiny product tips it either way.
	check(1.0/(1<<24), 1, 1)
	check(float32(math.Ldexp(1, -24)+math.Ldexp(1, -47)), 1+float32(math.Ldexp(1, -23)), 1)
	check(-float32(math.Ldexp(1, -70)), 1, 1+float32(math.Ldexp(1, -23))/2)
}

// The avx_mathfun polynomials are accurate approximations: a sanity bound against math.
func TestAVXMathAccuracy(t *testing.T) {
	for i := 1; i <= 1<<16; i++ {
		u := float32(i) / (1 << 16) // (0, 1], the Box-Muller radius argument
		if d := math.Abs(float64(avxLog(u)) - math.Log(float64(u))); d > 2e-7*math.Max(1, math.Abs(math.Log(float64(u)))) {
			t.Fatalf("log(%g): %g vs %g", u, avxLog(u), math.Log(float64(u)))
		}
		th := twoPi * (float32(i-1) / (1 << 16))
		s, c := avxSincos(th)
		if math.Abs(float64(s)-math.Sin(float64(th))) > 3e-7 || math.Abs(float64(c)-math.Cos(float64(th))) > 3e-7 {
			t.Fatalf("sincos(%g): %g %g vs %g %g", th, s, c, math.Sin(float64(th)), math.Cos(float64(th)))
		}
	}
	if !math.IsNaN(float64(avxLog(0))) || !math.IsNaN(float64(avxLog(-1))) {
		t.Fatal("log of a non-positive number is not NaN")
	}
}

func BenchmarkRandnSection(b *testing.B) {
	g := New(31337)
	dst := make([]float32, 16*9*68*88)
	b.SetBytes(int64(4 * len(dst)))
	for b.Loop() {
		g.FillRandn(dst)
	}
}
