package runtime

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
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

// requireFP8MMA makes TestLinearQ fail when an activation mode falls back to weight-only for a
// per-channel weight (scripts/gpu-check.sh phase fp8 sets it on GPUs with fp8 matrix units).
var requireFP8MMA = flag.Bool("fp8.require-mma", false, "TestLinearQ: the fp8 x fp8 path must serve per-channel weights")

// TestLinearQ checks LinearQ in every compute mode against float64: a weight [N, K] in e4m3 with
// per-channel, per-tensor and block-wise scales, activations taken as they are (weight-only) or
// quantized to e4m3 per tensor or per token with s = max|x|/448 in f32 and q = e4m3(clamp(x/s,
// ±448)), with the bias and GELU epilogue and with neither, f32 and bf16 activations, at two
// sizes (N 20: rows of an odd byte length, which cuBLASLt's direct fp8 output declines; N 48 with
// K 96: one it takes); and the stats count the mode that served. The cpu backend serves every
// mode; a GPU falls back to weight-only where it has no fp8 × fp8 path (block-wise scales
// always), and the output is then checked against the weight-only reference.
func TestLinearQ(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rand.New(rand.NewPCG(7, 8))
	for _, size := range []struct{ M, N, K, block int }{{6, 20, 64, 16}, {5, 48, 96, 32}} {
		M, N, K := size.M, size.N, size.K
		xv := make([]float32, 2*M*K) // [2, M, K]: the batch dims flatten
		for i := range xv {
			xv[i] = float32(r.NormFloat64() * (1 + float64(i%K)/8))
		}
		wq := make([]byte, N*K)
		for i := range wq {
			wq[i] = byte(r.IntN(256))
			if wq[i]&0x7f == 0x7f { // no NaN weights
				wq[i] = 0x3c
			}
		}
		bias := make([]float32, N)
		for i := range bias {
			bias[i] = float32(r.NormFloat64())
		}
		for _, sc := range []struct {
			name       string
			rows, nb   int
			bias, gelu bool
		}{
			{"per channel", N, 1, true, true}, {"per channel, no epilogue", N, 1, false, false},
			{"per tensor", 1, 1, true, true}, {"per tensor, bias only", 1, 1, true, false},
			{"block-wise", N, K / size.block, true, true},
		} {
			name := fmt.Sprintf("%dx%dx%d %s", M, N, K, sc.name)
			sv := make([]float32, sc.rows*sc.nb)
			for i := range sv {
				sv[i] = float32(0.01 + r.Float64())
			}
			w, err := rt.FromBytes(F8E4M3, F8E4M3, wq, N, K)
			if err != nil {
				t.Fatal(err)
			}
			s, err := rt.FromFloat32(sv, sc.rows, sc.nb)
			if err != nil {
				t.Fatal(err)
			}
			deqw := make([]float64, N*K)
			for n := range N {
				srow := n
				if sc.rows == 1 {
					srow = 0
				}
				for k := range K {
					deqw[n*K+k] = float64(safetensors.E4M3ToF32(wq[n*K+k])) * float64(sv[srow*sc.nb+k/(K/sc.nb)])
				}
			}
			epi := EpilogueNone
			if sc.gelu {
				epi = EpilogueGELUTanh
			}
			for _, mode := range []FP8Compute{FP8WeightOnly, FP8ActPerTensor, FP8ActPerToken} {
				for _, adt := range []DType{F32, BF16} {
					checkLinearQ(t, rt, linearQCase{name: name, M: M, N: N, K: K, x: xv, bias: bias, useBias: sc.bias, epi: epi,
						w: w, s: s, deqw: deqw, mode: mode, adt: adt, perChannelOrTensor: sc.nb == 1})
				}
			}
			w.Free()
			s.Free()
		}
	}
	rt.SetFP8Compute(FP8WeightOnly)
}

// linearQCase is one LinearQ call of TestLinearQ: x [2, M, K] (f32 values), the weight w and its
// scales s, deqw the dequantized weight in float64, the bias (when useBias) and epilogue, the
// compute mode and the activation dtype.
type linearQCase struct {
	name               string
	M, N, K            int
	x, bias            []float32
	useBias            bool
	epi                GemmEpilogue
	w, s               *Tensor
	deqw               []float64
	mode               FP8Compute
	adt                DType
	perChannelOrTensor bool // scales an fp8 x fp8 path must serve (-fp8.require-mma)
}

func checkLinearQ(t *testing.T, rt *Runtime, c linearQCase) {
	t.Helper()
	M, N, K := c.M, c.N, c.K
	label := fmt.Sprintf("%s %s %s", c.name, c.mode, c.adt)
	quant := func(v []float32, s float32) []float64 {
		cl := make([]float32, len(v))
		for i, x := range v {
			cl[i] = max(-448, min(448, x/s))
		}
		q, err := rt.FromFloat32As(F8E4M3, cl, len(cl))
		if err != nil {
			t.Fatal(err)
		}
		defer q.Free()
		b, _ := q.Bytes()
		out := make([]float64, len(b))
		for i, x := range b {
			out[i] = float64(safetensors.E4M3ToF32(x)) * float64(s)
		}
		return out
	}
	scaleOf := func(v []float32) float32 {
		m := float32(0)
		for _, x := range v {
			m = max(m, float32(math.Abs(float64(x))))
		}
		if m == 0 {
			return 1
		}
		return m / 448
	}
	xin := c.x
	if c.adt == BF16 { // the reference sees the bf16 values
		xin = make([]float32, len(c.x))
		for i, x := range c.x {
			xin[i] = safetensors.BF16ToF32(safetensors.F32ToBF16(x))
		}
	}
	ref := func(xq []float64) []float64 {
		want := make([]float64, 2*M*N)
		for row := range 2 * M {
			for n := range N {
				acc := 0.0
				if c.useBias {
					acc = float64(c.bias[n])
				}
				for k := range K {
					acc += xq[row*K+k] * c.deqw[n*K+k]
				}
				if c.epi == EpilogueGELUTanh {
					acc = 0.5 * acc * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(acc+0.044715*acc*acc*acc)))
				}
				want[row*N+n] = acc
			}
		}
		return want
	}
	var xq []float64
	switch c.mode {
	case FP8WeightOnly:
		xq = toF64(xin)
	case FP8ActPerTensor:
		xq = quant(xin, scaleOf(xin))
	case FP8ActPerToken:
		for row := range 2 * M {
			xq = append(xq, quant(xin[row*K:(row+1)*K], scaleOf(xin[row*K:(row+1)*K]))...)
		}
	}
	want := ref(xq)
	x, err := rt.FromFloat32As(c.adt, xin, 2, M, K)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	var b *Tensor
	if c.useBias {
		if b, err = rt.FromFloat32As(c.adt, c.bias, N); err != nil {
			t.Fatal(err)
		}
		defer b.Free()
	}
	rt.SetFP8Compute(c.mode)
	before := rt.FP8Stats()
	y, err := rt.LinearQ(x, c.w, c.s, b, c.epi)
	if err != nil {
		t.Fatalf("%s: %v", label, err)
	}
	defer y.Free()
	if y.DType() != c.adt || !equalInts(y.Shape(), []int{2, M, N}) {
		t.Fatalf("%s: out %s", label, y)
	}
	got := values(t, y)
	after := rt.FP8Stats()
	served := [3]uint64{after.WeightOnly - before.WeightOnly, after.PerTensor - before.PerTensor, after.PerToken - before.PerToken}
	fell := after.FellBack != before.FellBack
	host := rt.Backend().IsHost
	servedBy := c.mode
	switch {
	case fell && (host || (*requireFP8MMA && c.perChannelOrTensor)):
		t.Errorf("%s: fell back to weight-only (stats %+v → %+v)", label, before, after)
	case fell:
		t.Logf("%s: no fp8 x fp8 path here, weight-only served", label)
		want, servedBy = ref(toF64(xin)), FP8WeightOnly
	}
	if served[servedBy] != 1 {
		t.Errorf("%s: stats %+v → %+v", label, before, after)
	}
	tol := 1e-6
	switch {
	case c.adt == BF16:
		tol = 8e-3 // one bf16 rounding of the output (and of the widened weight on a GPU)
	case !host && servedBy != FP8WeightOnly:
		// the matrix units' fp8 products: Hopper's fp8 MMA accumulates with reduced precision
		// (about 14 bits, DeepSeek-V3's report; cuBLASLt promotes the partial sums to f32 every
		// so many steps), so f32 sums in another order differ more than in f32 (measured on an
		// H200: rel L2 1.06e-4 per tensor, 1.0e-4 per token at N 20)
		tol = 1e-3
	case !host:
		tol = 1e-4 // f32 sums in another order
	}
	if d := relL2(got, want); d > tol {
		t.Errorf("%s: rel L2 %.3g > %g", label, d, tol)
	}
}

// TestLinearQBadArgs checks LinearQ and MatMul refuse what fpk_op_gemm_q's contract does not
// allow, naming the problem: a scale that is not f32 [1 or out, a divisor of in], a 16-bit weight
// in LinearQ, an 8-bit operand in MatMul, an 8-bit activation.
func TestLinearQBadArgs(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	w, err := rt.FromBytes(F8E4M3, F8E4M3, make([]byte, 4*6), 4, 6)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Free()
	x, _ := rt.FromFloat32(make([]float32, 2*6), 2, 6)
	defer x.Free()
	mk := func(dt DType, shape ...int) *Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		tt, err := rt.FromFloat32As(dt, make([]float32, n), shape...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(tt.Free)
		return tt
	}
	for _, c := range []struct {
		name string
		run  func() error
		want string
	}{
		{"scale blocks do not divide", func() error { _, err := rt.LinearQ(x, w, mk(F32, 4, 4), nil, EpilogueNone); return err }, "w_scale"},
		{"scale rows", func() error { _, err := rt.LinearQ(x, w, mk(F32, 3, 1), nil, EpilogueNone); return err }, "w_scale"},
		{"scale dtype", func() error { _, err := rt.LinearQ(x, w, mk(BF16, 4, 1), nil, EpilogueNone); return err }, "w_scale"},
		{"16-bit weight", func() error { _, err := rt.LinearQ(x, mk(BF16, 4, 6), nil, nil, EpilogueNone); return err }, "8-bit"},
		{"8-bit activations", func() error { _, err := rt.LinearQ(mk(F8E4M3, 2, 6), w, nil, nil, EpilogueNone); return err }, "16- or 32-bit"},
		{"matmul with an 8-bit b", func() error { _, err := rt.MatMul(x, w, GemmParams{TransB: true}); return err }, "fpk_op_gemm_q"},
	} {
		err := c.run()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one saying %q", c.name, err, c.want)
		}
	}
}
