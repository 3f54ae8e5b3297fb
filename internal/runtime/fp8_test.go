package runtime

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// TestFP8DecodeExhaustive widens every e4m3 and e5m2 bit pattern to f32 through the runtime
// (an upload converts) and checks it against the safetensors package's decoding, then casts the
// f32 values back and checks every pattern round-trips (NaNs stay NaN).
func TestFP8DecodeExhaustive(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	raw := make([]byte, 256)
	for i := range raw {
		raw[i] = byte(i)
	}
	for _, c := range []struct {
		dt  DType
		ref func(uint8) float32
	}{{F8E4M3, safetensors.E4M3ToF32}, {F8E5M2, safetensors.E5M2ToF32}} {
		t.Run(c.dt.String(), func(t *testing.T) {
			x, err := rt.FromBytes(F32, c.dt, raw, 256)
			if err != nil {
				t.Fatal(err)
			}
			defer x.Free()
			got := values(t, x)
			for q := range 256 {
				want := c.ref(uint8(q))
				if math.Float32bits(got[q]) != math.Float32bits(want) && !(isNaN32(want) && isNaN32(got[q])) {
					t.Fatalf("%s %#02x: got %g, want %g", c.dt, q, got[q], want)
				}
			}
			back := castTo(t, rt, x, c.dt)
			defer back.Free()
			b, err := back.Bytes()
			if err != nil {
				t.Fatal(err)
			}
			for q := range 256 {
				if b[q] != byte(q) && !(isNaN32(c.ref(uint8(q))) && isNaN32(c.ref(b[q]))) {
					t.Errorf("%s %#02x (%g) cast back to %#02x", c.dt, q, c.ref(uint8(q)), b[q])
				}
			}
		})
	}
}

func isNaN32(f float32) bool { return f != f }

// TestFP8Rounding casts the values where the rules show (ties to even, subnormals, the largest
// finite values, overflow, infinities, NaN) to e4m3 and e5m2 and checks the bytes PyTorch's
// casts give: round to nearest even, no saturation (e4m3 overflow is NaN, e5m2's infinity).
func TestFP8Rounding(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	cases := []struct {
		dt   DType
		in   float32
		want byte
	}{
		{F8E4M3, 0, 0x00}, {F8E4M3, float32(math.Copysign(0, -1)), 0x80}, {F8E4M3, 1, 0x38}, {F8E4M3, -2, 0xc0},
		{F8E4M3, 448, 0x7e}, {F8E4M3, 464, 0x7e}, // the tie between 448 and the NaN pattern goes to even (448)
		{F8E4M3, 465, 0x7f}, {F8E4M3, 480, 0x7f}, {F8E4M3, 1e6, 0x7f}, {F8E4M3, -1e6, 0xff},
		{F8E4M3, inf, 0x7f}, {F8E4M3, nan, 0x7f},
		{F8E4M3, 1.0625, 0x38}, {F8E4M3, 1.1875, 0x3a}, // ties: 1 + 1/16 → 1, 1 + 3/16 → 1.25
		{F8E4M3, 0x1p-9, 0x01}, {F8E4M3, 0x1p-10, 0x00}, {F8E4M3, 0x1.8p-10, 0x01}, {F8E4M3, 0x1.8p-9, 0x02},
		{F8E4M3, 0x1.cp-7, 0x07}, {F8E4M3, 0x1.fp-7, 0x08}, // subnormal to smallest normal 2^-6
		{F8E5M2, 1, 0x3c}, {F8E5M2, 57344, 0x7b}, {F8E5M2, 61439, 0x7b}, {F8E5M2, 61440, 0x7c},
		{F8E5M2, 1e9, 0x7c}, {F8E5M2, -inf, 0xfc}, {F8E5M2, 0x1p-16, 0x01}, {F8E5M2, 0x1p-17, 0x00},
		{F8E5M2, 1.125, 0x3c}, {F8E5M2, 1.375, 0x3e},
	}
	for _, c := range cases {
		x, err := rt.FromFloat32As(c.dt, []float32{c.in}, 1)
		if err != nil {
			t.Fatal(err)
		}
		b, err := x.Bytes()
		x.Free()
		if err != nil {
			t.Fatal(err)
		}
		if b[0] != c.want {
			t.Errorf("%s(%g) = %#02x, want %#02x", c.dt, c.in, b[0], c.want)
		}
	}
	x, err := rt.FromFloat32As(F8E5M2, []float32{nan}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	if b, _ := x.Bytes(); !isNaN32(safetensors.E5M2ToF32(b[0])) {
		t.Errorf("e5m2(NaN) = %#02x, not a NaN", b[0])
	}
}

// TestFP8CastMatchesTorch casts the bf16 weights of the fixture's transformer to e4m3 through
// the runtime and compares them byte for byte with the fixture's plain fp8 checkpoint, which
// PyTorch's .to(torch.float8_e4m3fn) wrote from the same weights.
func TestFP8CastMatchesTorch(t *testing.T) {
	fx := parity.Load(t, "fp8")
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	base, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	plain, err := safetensors.Open(filepath.Join(fx.Root, "models", "fp8", "fp8_plain_e4m3fn.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	rt := newTestRuntime(t, Options{})
	compared := 0
	for _, name := range plain.Names() {
		info, _ := plain.Info(name)
		if info.DType != safetensors.F8E4M3 || !strings.HasSuffix(name, ".weight") {
			continue
		}
		w, err := rt.LoadTensor(base, name, F8E4M3) // bf16 → e4m3 by the runtime's conversion
		if err != nil {
			t.Fatal(err)
		}
		got, err := w.Bytes()
		w.Free()
		if err != nil {
			t.Fatal(err)
		}
		want, err := plain.Bytes(name)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s[%d]: runtime cast %#02x, torch %#02x", name, i, got[i], want[i])
			}
		}
		compared++
	}
	if compared == 0 {
		t.Fatal("no e4m3 weights in the plain fixture checkpoint")
	}
}
