package runtime

import (
	"encoding/binary"
	"math"
	"path/filepath"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/safetensors"
)

func u16bytes(v []uint16) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], x)
	}
	return b
}

// TestHalfConversionsExhaustive converts every f16 and bf16 bit pattern to f32 through the
// runtime (upload converts) and checks it against the safetensors package's conversion bit for
// bit; then converts back (cast f32 → f16/bf16) and checks the bits round-trip (NaNs stay NaN).
func TestHalfConversionsExhaustive(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	all := make([]uint16, 1<<16)
	for i := range all {
		all[i] = uint16(i)
	}
	raw := u16bytes(all)
	for _, c := range []struct {
		dt  DType
		ref func(uint16) float32
	}{
		{F16, safetensors.F16ToF32},
		{BF16, safetensors.BF16ToF32},
	} {
		t.Run(c.dt.String(), func(t *testing.T) {
			x, err := rt.FromBytes(F32, c.dt, raw, len(all))
			if err != nil {
				t.Fatal(err)
			}
			defer x.Free()
			got, err := x.Float32()
			if err != nil {
				t.Fatal(err)
			}
			for i, h := range all {
				want := c.ref(h)
				if math.Float32bits(got[i]) != math.Float32bits(want) &&
					!(math.IsNaN(float64(want)) && math.IsNaN(float64(got[i]))) {
					t.Fatalf("%s %#04x: got %g (%#08x), want %g (%#08x)", c.dt, h, got[i],
						math.Float32bits(got[i]), want, math.Float32bits(want))
				}
			}
			back, err := rt.Cast(x, c.dt)
			if err != nil {
				t.Fatal(err)
			}
			defer back.Free()
			bb, err := back.Bytes()
			if err != nil {
				t.Fatal(err)
			}
			for i, h := range all {
				g := binary.LittleEndian.Uint16(bb[2*i:])
				if math.IsNaN(float64(c.ref(h))) {
					if !math.IsNaN(float64(c.ref(g))) {
						t.Fatalf("%s NaN %#04x came back as %#04x", c.dt, h, g)
					}
					continue
				}
				if g != h {
					t.Fatalf("%s %#04x came back as %#04x", c.dt, h, g)
				}
			}
		})
	}
}

// TestF32ToHalfRounding checks f32 → f16/bf16 against the safetensors package (round to
// nearest even, overflow to infinity, subnormals) on values between representable ones.
func TestF32ToHalfRounding(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rng(t)
	vals := []float32{0, -0, 1, 65504, 65519, 65520, 1e6, -1e6, 5.96e-8, 2.98e-8, 2.99e-8, 6.1e-5,
		1.0009765625, 1.00048828125, 1.000732421875, 3.0e38, float32(math.Inf(1)), float32(math.Inf(-1))}
	for range 4000 {
		e := r.IntN(80) - 40
		vals = append(vals, float32(r.NormFloat64()*math.Pow(2, float64(e))))
	}
	for _, c := range []struct {
		dt  DType
		ref func(float32) uint16
	}{
		{F16, safetensors.F32ToF16},
		{BF16, safetensors.F32ToBF16},
	} {
		x, err := rt.FromFloat32(vals, len(vals))
		if err != nil {
			t.Fatal(err)
		}
		h, err := rt.Cast(x, c.dt)
		x.Free()
		if err != nil {
			t.Fatal(err)
		}
		b, err := h.Bytes()
		h.Free()
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range vals {
			if g, w := binary.LittleEndian.Uint16(b[2*i:]), c.ref(v); g != w {
				t.Fatalf("%s of %g: got %#04x, want %#04x", c.dt, v, g, w)
			}
		}
	}
}

// TestFixtureWeightsRoundTrip loads every tensor of the fp16 VAE and the bf16 transformer
// fixture checkpoints: converted to f32 on upload it must equal the safetensors package's
// conversion bit for bit; kept in its storage dtype (named, or AsStored) it must download as
// the original bytes; and cast back from f32 it must give the original bytes again.
func TestFixtureWeightsRoundTrip(t *testing.T) {
	root, err := parity.Root()
	if err != nil {
		t.Fatalf("fixture root: %v", err)
	}
	rt := newTestRuntime(t, Options{})
	for _, c := range []struct {
		path string
		dt   safetensors.DType
	}{
		{"models/hunyuanvideo/vae/diffusion_pytorch_model.safetensors", safetensors.F16},
		{"models/framepack_i2v/diffusion_pytorch_model.safetensors", safetensors.BF16},
	} {
		t.Run(string(c.dt), func(t *testing.T) {
			f, err := safetensors.Open(filepath.Join(root, c.path))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			n := 0
			for _, name := range f.Names() {
				info, _ := f.Info(name)
				if info.DType != c.dt {
					continue
				}
				n++
				raw, err := f.Bytes(name)
				if err != nil {
					t.Fatal(err)
				}
				want, _, err := f.Float32(name)
				if err != nil {
					t.Fatal(err)
				}
				x, err := rt.LoadTensor(f, name, F32)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				got, err := x.Float32()
				if err != nil {
					t.Fatal(err)
				}
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s[%d]: got %g, want %g", name, i, got[i], want[i])
					}
				}
				sdt, _ := DTypeOf(c.dt)
				back, err := rt.Cast(x, sdt)
				x.Free()
				if err != nil {
					t.Fatal(err)
				}
				bb, err := back.Bytes()
				back.Free()
				if err != nil {
					t.Fatal(err)
				}
				if string(bb) != string(raw) {
					t.Fatalf("%s: f32 → %s does not give the checkpoint's bytes back", name, c.dt)
				}
				stored, err := rt.LoadTensor(f, name, sdt)
				if err != nil {
					t.Fatal(err)
				}
				sb, err := stored.Bytes()
				stored.Free()
				if err != nil {
					t.Fatal(err)
				}
				if string(sb) != string(raw) {
					t.Fatalf("%s: stored as %s, downloads different bytes", name, sdt)
				}
				as, err := rt.LoadTensor(f, name, AsStored)
				if err != nil {
					t.Fatal(err)
				}
				ab, err := as.Bytes()
				adt := as.DType()
				as.Free()
				if err != nil {
					t.Fatal(err)
				}
				if adt != sdt || string(ab) != string(raw) {
					t.Fatalf("%s: loaded as stored: %s and other bytes, want %s and the checkpoint's", name, adt, sdt)
				}
			}
			if n == 0 {
				t.Fatalf("%s has no %s tensors", c.path, c.dt)
			}
			t.Logf("%s: %d %s tensors round-trip exactly", c.path, n, c.dt)
		})
	}
}

func TestParseWeightDType(t *testing.T) {
	for _, c := range []struct {
		in   string
		want DType
	}{{"", F32}, {"fp32", F32}, {"fp16", F16}, {"bf16", BF16}, {"auto", AsStored}} {
		got, err := ParseWeightDType(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseWeightDType(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"f32", "float16", "int8", "BF16"} {
		if _, err := ParseWeightDType(bad); err == nil {
			t.Errorf("ParseWeightDType(%q): no error", bad)
		}
	}
	if AsStored.Size() != 0 || AsStored.IsFloat() {
		t.Errorf("AsStored must not be a dtype a tensor can have")
	}
	for _, c := range []struct {
		in   safetensors.DType
		want DType
	}{{safetensors.F16, F16}, {safetensors.BF16, BF16}, {safetensors.F32, F32}, {safetensors.F64, F32},
		{safetensors.I64, I32}, {safetensors.U8, U8}} {
		if got := StoredDType(c.in); got != c.want {
			t.Errorf("StoredDType(%s) = %s, want %s", c.in, got, c.want)
		}
	}
}
