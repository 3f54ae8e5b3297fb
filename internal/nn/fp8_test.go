package nn

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/framepackd/framepackd/internal/fp8"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// fp8Variant is one way an 8-bit Linear weight [out, in] is stored.
type fp8Variant struct {
	name   string
	dt     runtime.DType
	format fp8.Format
	// scales returns the stored scale tensors of weight w (float64 values, out × in) and the
	// scale each element is divided by before the cast.
	scales func(w []float64, out, in int) ([]safetensors.Tensor, func(o, i int) float64)
}

func absmax(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = math.Max(m, math.Abs(x))
	}
	return m
}

func fp8Variants() []fp8Variant {
	const block = 16
	none := func(w []float64, out, in int) ([]safetensors.Tensor, func(o, i int) float64) {
		return nil, func(o, i int) float64 { return 1 }
	}
	perTensor := func(shape []int64, extra ...safetensors.Tensor) func(w []float64, out, in int) ([]safetensors.Tensor, func(o, i int) float64) {
		return func(w []float64, out, in int) ([]safetensors.Tensor, func(o, i int) float64) {
			s := float32(absmax(w) / 448)
			return append([]safetensors.Tensor{safetensors.FromFloat32("lin.scale_weight", shape, []float32{s})}, extra...),
				func(o, i int) float64 { return float64(s) }
		}
	}
	channel := func(w []float64, out, in int) ([]safetensors.Tensor, func(o, i int) float64) {
		s := make([]float32, out)
		for o := range out {
			s[o] = float32(absmax(w[o*in:(o+1)*in]) / 448)
		}
		return []safetensors.Tensor{safetensors.FromFloat32("lin.scale_weight", []int64{int64(out), 1}, s)},
			func(o, i int) float64 { return float64(s[o]) }
	}
	blockwise := func(two bool) func(w []float64, out, in int) ([]safetensors.Tensor, func(o, i int) float64) {
		return func(w []float64, out, in int) ([]safetensors.Tensor, func(o, i int) float64) {
			nb := in / block
			s := make([]float32, out*nb)
			for o := range out {
				for b := range nb {
					s[o*nb+b] = float32(absmax(w[o*in+b*block:o*in+(b+1)*block]) / 448)
				}
			}
			tensor := float32(1)
			ts := []safetensors.Tensor{}
			if two { // musubi's two-level scales: block scales divided by their max
				tensor = s[0]
				for _, v := range s {
					tensor = max(tensor, v)
				}
				for i := range s {
					s[i] /= tensor
				}
				ts = append(ts, safetensors.FromFloat32("lin.scale_weight_tensor", nil, []float32{tensor}))
			}
			ts = append(ts, safetensors.FromFloat32("lin.scale_weight", []int64{int64(out), int64(nb), 1}, s))
			return ts, func(o, i int) float64 { return float64(s[o*nb+i/block]) * float64(tensor) }
		}
	}
	marker := safetensors.Tensor{Name: fp8.Marker, DType: safetensors.F8E4M3, Shape: []int64{0}}
	return []fp8Variant{
		{"plain e4m3", runtime.F8E4M3, fp8.Plain, none},
		{"plain e5m2", runtime.F8E5M2, fp8.Plain, none},
		{"comfy", runtime.F8E4M3, fp8.Comfy, perTensor(nil, marker, safetensors.FromFloat32("lin.scale_input", nil, []float32{0.1}))},
		{"comfy e5m2", runtime.F8E5M2, fp8.Comfy, perTensor([]int64{1}, safetensors.Tensor{Name: fp8.Marker, DType: safetensors.F8E5M2, Shape: []int64{0}})},
		{"musubi per tensor", runtime.F8E4M3, fp8.Musubi, perTensor(nil)},
		{"musubi per channel", runtime.F8E4M3, fp8.Musubi, channel},
		{"musubi block", runtime.F8E4M3, fp8.Musubi, blockwise(false)},
		{"musubi block two-level", runtime.F8E4M3, fp8.Musubi, blockwise(true)},
		{"musubi block e5m2", runtime.F8E5M2, fp8.Musubi, blockwise(true)},
	}
}

// writeFP8Linear writes the Linear "lin" [out, in] with weights w (float64) in variant v, a bias,
// and returns the checkpoint and the dequantized weight in float64 (q·s exactly).
func writeFP8Linear(t *testing.T, rt *runtime.Runtime, v fp8Variant, w []float64, bias []float32, out, in int) (*safetensors.Checkpoint, []float64) {
	t.Helper()
	ts, scale := v.scales(w, out, in)
	scaled := make([]float32, len(w))
	for i := range w {
		scaled[i] = float32(w[i] / scale(i/in, i%in))
	}
	q, err := rt.FromFloat32As(v.dt, scaled, out, in)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := q.Bytes()
	q.Free()
	if err != nil {
		t.Fatal(err)
	}
	sdt := safetensors.F8E4M3
	decode := safetensors.E4M3ToF32
	if v.dt == runtime.F8E5M2 {
		sdt, decode = safetensors.F8E5M2, safetensors.E5M2ToF32
	}
	deq := make([]float64, len(raw))
	for i, b := range raw {
		deq[i] = float64(decode(b)) * scale(i/in, i%in)
	}
	ts = append(ts, safetensors.Tensor{Name: "lin.weight", DType: sdt, Shape: []int64{int64(out), int64(in)}, Data: raw},
		safetensors.FromFloat32("lin.bias", []int64{int64(out)}, bias))
	path := t.TempDir() + "/fp8.safetensors"
	if err := safetensors.WriteFile(path, ts, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	return ck, deq
}

// linearRef is x [rows, in] · wᵀ + b in float64.
func linearRef(x []float32, w []float64, b []float32, rows, in, out int) []float64 {
	y := make([]float64, rows*out)
	for r := range rows {
		for o := range out {
			s := float64(b[o])
			for i := range in {
				s += float64(x[r*in+i]) * w[o*in+i]
			}
			y[r*out+o] = s
		}
	}
	return y
}

func relL2(got []float32, want []float64) float64 {
	var num, den float64
	for i := range want {
		d := float64(got[i]) - want[i]
		num += d * d
		den += want[i] * want[i]
	}
	return math.Sqrt(num / den)
}

// TestLinearFP8Variants stores one Linear in every 8-bit variant (plain e4m3/e5m2, ComfyUI
// scaled per tensor with a scale_input, musubi per tensor, per channel, block-wise with and
// without the tensor scale, in e5m2 too), loads it through the loader — uploaded, and through a
// host copy as a streamed block holds it — and checks the layer's output against the float64
// product with the exactly dequantized weight, and the format the loader reports.
func TestLinearFP8Variants(t *testing.T) {
	rt := newRuntime(t)
	const out, in, rows = 24, 64, 5
	r := rand.New(rand.NewPCG(1, 2))
	w := make([]float64, out*in)
	for i := range w {
		w[i] = r.NormFloat64() * 0.05 * float64(1+i%7) // uneven rows and blocks
	}
	bias := make([]float32, out)
	x := make([]float32, rows*in)
	for i := range bias {
		bias[i] = float32(r.NormFloat64())
	}
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	for _, v := range fp8Variants() {
		t.Run(v.name, func(t *testing.T) {
			ck, deq := writeFP8Linear(t, rt, v, w, bias, out, in)
			want := linearRef(x, deq, bias, rows, in, out)
			for _, host := range []bool{false, true} {
				l := NewLoader(rt, ck, Options{}, "")
				if l.FP8Format() != v.format {
					t.Errorf("format %q, want %q", l.FP8Format(), v.format)
				}
				var lin Linear
				var h *HostSource
				if host { // as a streamed block: into a host copy, then bound from it
					h = l.BeginHost("")
					NewLinear(l, "lin", in, out, true)
					l.EndHost()
				} else {
					lin = NewLinear(l, "lin", in, out, true)
				}
				ws, rep, err := l.Finish()
				if err != nil {
					t.Fatal(err)
				}
				if len(rep.Unexpected) > 0 {
					t.Errorf("unexpected tensors %v (scales and marker belong to the layout)", rep.Unexpected)
				}
				if host {
					hl := NewLoader(rt, h, Options{DType: runtime.AsStored, WeightDType: runtime.AsStored}, "")
					lin = NewLinear(hl, "lin", in, out, true)
					hws, _, err := hl.Finish()
					if err != nil {
						t.Fatal(err)
					}
					defer hws.Free()
					defer h.Free()
				}
				defer ws.Free()
				if lin.Weight.DType() != v.dt {
					t.Fatalf("weight bound as %s, want %s (kept in 8 bits)", lin.Weight.DType(), v.dt)
				}
				xt, err := rt.FromFloat32(x, rows, in)
				if err != nil {
					t.Fatal(err)
				}
				defer xt.Free()
				p := NewPass(t.Context(), rt)
				y := lin.Forward(p, xt)
				if err := p.Err(); err != nil {
					t.Fatal(err)
				}
				got, err := y.Float32()
				y.Free()
				if err != nil {
					t.Fatal(err)
				}
				if d := relL2(got, want); d > 1e-6 {
					t.Errorf("host %v: rel L2 %.3g against the float64 product with the dequantized weight", host, d)
				}
			}
		})
	}
}

// TestLinearQuantizeAtLoad quantizes a bf16 Linear at load (Options.QuantizeLinear) and checks the
// bytes and scales against the rule computed here in float64 (s = max(max|w|/448, 1e-8) per row
// in float32, q = e4m3(w/s)), and the output against the float64 product with q·s.
func TestLinearQuantizeAtLoad(t *testing.T) {
	rt := newRuntime(t)
	const out, in, rows = 16, 48, 3
	r := rand.New(rand.NewPCG(3, 4))
	wf := make([]float32, out*in)
	for i := range wf {
		wf[i] = float32(r.NormFloat64() * 0.1 * float64(1+i/in))
	}
	for i := range in { // a row of zeros gets the smallest scale and quantizes to zeros
		wf[3*in+i] = 0
	}
	wt, err := rt.FromFloat32As(runtime.BF16, wf, out, in)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := wt.Bytes()
	wt.Free()
	path := t.TempDir() + "/bf16.safetensors"
	bias := make([]float32, out)
	if err := safetensors.WriteFile(path, []safetensors.Tensor{{Name: "lin.weight", DType: safetensors.BF16, Shape: []int64{out, in}, Data: raw},
		safetensors.FromFloat32("lin.bias", []int64{out}, bias)}, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	l := NewLoader(rt, ck, Options{QuantizeLinear: true}, "")
	lin := NewLinear(l, "lin", in, out, true)
	ws, _, err := l.Finish()
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Free()
	if l.FP8Format() != fp8.Quantized || lin.Weight.DType() != runtime.F8E4M3 || lin.Scale == nil {
		t.Fatalf("format %q, weight %s, scale %v", l.FP8Format(), lin.Weight.DType(), lin.Scale)
	}
	qb, _ := lin.Weight.Bytes()
	sv, _ := lin.Scale.Float32()
	deq := make([]float64, out*in)
	for o := range out {
		m := float32(0)
		for i := range in {
			m = max(m, float32(math.Abs(float64(safetensors.BF16ToF32(uint16(raw[2*(o*in+i)])|uint16(raw[2*(o*in+i)+1])<<8)))))
		}
		s := max(m/448, 1e-8)
		if sv[o] != s {
			t.Fatalf("row %d: scale %g, want %g", o, sv[o], s)
		}
		for i := range in {
			wv := safetensors.BF16ToF32(uint16(raw[2*(o*in+i)]) | uint16(raw[2*(o*in+i)+1])<<8)
			qt, _ := rt.FromFloat32As(runtime.F8E4M3, []float32{wv / s}, 1)
			want, _ := qt.Bytes()
			qt.Free()
			if qb[o*in+i] != want[0] {
				t.Fatalf("w[%d][%d] = %g: q %#02x, want %#02x", o, i, wv, qb[o*in+i], want[0])
			}
			deq[o*in+i] = float64(safetensors.E4M3ToF32(qb[o*in+i])) * float64(s)
		}
	}
	x := make([]float32, rows*in)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	xt, _ := rt.FromFloat32(x, rows, in)
	defer xt.Free()
	p := NewPass(t.Context(), rt)
	y := lin.Forward(p, xt)
	if err := p.Err(); err != nil {
		t.Fatal(err)
	}
	got, _ := y.Float32()
	y.Free()
	if d := relL2(got, linearRef(x, deq, bias, rows, in, out)); d > 1e-6 {
		t.Errorf("rel L2 %.3g", d)
	}
}
