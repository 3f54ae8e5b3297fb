package sampler

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// funcModel is a Model from a function, recording what it was given.
type funcModel struct {
	f     func(in ForwardInput) []float32
	calls []ForwardInput
}

func (m *funcModel) Forward(_ context.Context, in ForwardInput) ([]float32, error) {
	rec := in
	rec.X = append([]float32(nil), in.X...)
	m.calls = append(m.calls, rec)
	return m.f(in), nil
}

func TestBF16CastOfTimestepAndGuidance(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    DType
		in   float32
		want float32
	}{
		{"guidance 10 → 9984", BF16, 10000, 9984},
		{"guidance 6 ties to even", BF16, 6000, 6016},
		{"timestep 1000 exact", BF16, 1000, 1000},
		{"timestep 876.5", BF16, 876.5, 876},
		{"timestep 999.9 rounds up", BF16, 999.9, 1000},
		{"f16 keeps 10000", F16, 10000, 10000},
		{"f16 rounds 999.9", F16, 999.9, 1000},
		{"f32 unchanged", F32, 999.9, 999.9},
		{"f64 unchanged", F64, 987.654, 987.654},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.d.Round(tc.in); got != tc.want {
				t.Fatalf("%v.Round(%v) = %v, want %v", tc.d, tc.in, got, tc.want)
			}
		})
	}
	// sigma 0.9 · 1000 is 900.00006 in float32, then bf16 900.
	if got := Timestep(0.9, BF16); got != 900 {
		t.Fatalf("Timestep(0.9, bf16) = %v", got)
	}
	if got := Timestep(0.9, F32); got != float32(0.9)*1000 {
		t.Fatalf("Timestep(0.9, f32) = %v", got)
	}
}

// The wrapper hands the model bf16-rounded x, timestep and guidance, and computes x0 from the
// rounded x, as fm_wrapper does with dtype=torch.bfloat16.
func TestWrapperRoundsModelInputs(t *testing.T) {
	shape := Shape{1, 2, 1, 1, 2}
	m := &funcModel{f: func(in ForwardInput) []float32 { return []float32{1, -1, 0.5, 2} }}
	den, err := FlowMatchDenoiser(m, shape, &Conditioning{}, nil, Guidance{Distilled: 10, CFG: 1}, BF16)
	if err != nil {
		t.Fatal(err)
	}
	x := []float32{1.00390625 + 1.0/1024, -3.3, 0.1, 7}
	sigma := float32(0.8765)
	x0, err := den(t.Context(), x, sigma, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.calls) != 1 {
		t.Fatalf("%d model calls, want 1 (cfg 1 runs no negative pass)", len(m.calls))
	}
	in := m.calls[0]
	if in.Guidance != 9984 || in.Timestep != 876 || in.Sigma != sigma || in.Step != 3 || in.Branch != Positive {
		t.Fatalf("model input guidance %v timestep %v sigma %v step %d branch %v", in.Guidance, in.Timestep, in.Sigma, in.Step, in.Branch)
	}
	v := []float32{1, -1, 0.5, 2}
	for i := range x {
		xr := BF16.Round(x[i])
		if in.X[i] != xr {
			t.Fatalf("x[%d] to model %v, want bf16 %v", i, in.X[i], xr)
		}
		if want := xr - v[i]*sigma; x0[i] != want {
			t.Fatalf("x0[%d] = %v, want %v", i, x0[i], want)
		}
	}
}

// Real CFG runs the negative branch separately and combines neg + cfg·(pos − neg), then
// rescales toward the positive branch's std.
func TestWrapperCFGAndRescale(t *testing.T) {
	shape := Shape{2, 4, 1, 2, 2} // two batch items, rescaled separately
	n := shape.Numel()
	rng := rand.New(rand.NewPCG(3, 4))
	vp, vn := make([]float32, n), make([]float32, n)
	for i := range vp {
		vp[i], vn[i] = float32(rng.NormFloat64()), float32(0.5*rng.NormFloat64()+0.2)
	}
	pos, neg := &Conditioning{}, &Conditioning{}
	m := &funcModel{f: func(in ForwardInput) []float32 {
		if in.Branch == Negative {
			if in.Cond != neg {
				t.Error("negative pass without the negative conditioning")
			}
			return vn
		}
		if in.Cond != pos {
			t.Error("positive pass without the positive conditioning")
		}
		return vp
	}}
	const cfg, rs = 3.0, 0.7
	den, err := FlowMatchDenoiser(m, shape, pos, neg, Guidance{Distilled: 6, CFG: cfg, Rescale: rs}, F32)
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	const sigma = 0.5
	x0, err := den(t.Context(), x, sigma, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.calls) != 2 || m.calls[1].Branch != Negative || m.calls[1].Guidance != 6000 {
		t.Fatalf("calls %+v", m.calls)
	}
	per := n / shape.B()
	for b := 0; b < shape.B(); b++ {
		g := make([]float64, per)
		p := make([]float64, per)
		for i := range g {
			p[i] = float64(vp[b*per+i])
			g[i] = float64(vn[b*per+i]) + cfg*(p[i]-float64(vn[b*per+i]))
		}
		ratio := std64(p) / std64(g)
		for i := range g {
			v := rs*g[i]*ratio + (1-rs)*g[i]
			want := float64(x[b*per+i]) - sigma*v
			if d := math.Abs(float64(x0[b*per+i]) - want); d > 1e-5*(1+math.Abs(want)) {
				t.Fatalf("batch %d x0[%d] = %v, want %v", b, i, x0[b*per+i], want)
			}
		}
	}
}

func std64(v []float64) float64 {
	var m, s float64
	for _, x := range v {
		m += x
	}
	m /= float64(len(v))
	for _, x := range v {
		s += (x - m) * (x - m)
	}
	return math.Sqrt(s / float64(len(v)-1))
}

// pointModel is the exact velocity when the data is the single point x0*: v = (x − x0*)/σ.
func pointModel(target []float32) *funcModel {
	return &funcModel{f: func(in ForwardInput) []float32 {
		v := make([]float32, len(in.X))
		for i := range v {
			v[i] = float32(float64(in.X[i]-target[i]) / float64(in.Sigma))
		}
		return v
	}}
}

// With the data a single point every data prediction is exact, and flow-matching UniPC is then
// exact too: x(σ) = x0* + σ/σ0·(x(σ0) − x0*) at every step, and the result is x0*.
func TestUniPCLandsOnSinglePoint(t *testing.T) {
	for _, tc := range []struct {
		name    string
		steps   int
		variant Variant
		dtype   DType
	}{
		{"1 step", 1, BH1, F32},
		{"2 steps", 2, BH1, F32},
		{"25 steps bh1", 25, BH1, F32},
		{"25 steps bh2", 25, BH2, F32},
		{"9 steps bf16 inputs", 9, BH1, BF16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shape := Shape{1, 16, 3, 4, 6}
			n := shape.Numel()
			rng := rand.New(rand.NewPCG(5, uint64(tc.steps)))
			target, noise := make([]float32, n), make([]float32, n)
			for i := range target {
				target[i] = float32(rng.NormFloat64())
				noise[i] = float32(rng.NormFloat64())
			}
			plan, err := PlanFor(shape, Options{Steps: tc.steps})
			if err != nil {
				t.Fatal(err)
			}
			stepsSeen := 0
			opts := Options{Steps: tc.steps, Guidance: Guidance{Distilled: 10, CFG: 1}, Variant: tc.variant, DType: tc.dtype,
				OnStep: func(s StepInfo) error {
					stepsSeen++
					if s.Steps != tc.steps || s.Sigma != plan.Sigmas[s.Step] {
						t.Errorf("step info %d/%d sigma %v", s.Step, s.Steps, s.Sigma)
					}
					if tc.dtype != F32 {
						return nil // the rounded x the model sees moves the path, not the target
					}
					r := float64(s.Sigma) / float64(plan.Sigmas[0])
					for i := range s.X {
						want := float64(target[i]) + r*(float64(noise[i])-float64(target[i]))
						if d := math.Abs(float64(s.X[i]) - want); d > 2e-6 {
							t.Fatalf("step %d x[%d] = %v, exact %v", s.Step, i, s.X[i], want)
						}
						if d := math.Abs(float64(s.Denoised[i]) - float64(target[i])); d > 2e-6 {
							t.Fatalf("step %d denoised[%d] = %v, want %v", s.Step, i, s.Denoised[i], target[i])
						}
					}
					return nil
				}}
			m := pointModel(target)
			out, err := Sample(t.Context(), m, Request{Noise: noise, Shape: shape, Positive: &Conditioning{}, Options: opts})
			if err != nil {
				t.Fatal(err)
			}
			if stepsSeen != tc.steps || len(m.calls) != tc.steps {
				t.Fatalf("%d callbacks and %d model calls, want %d each", stepsSeen, len(m.calls), tc.steps)
			}
			var worst float64
			for i := range out {
				worst = math.Max(worst, math.Abs(float64(out[i])-float64(target[i])))
			}
			t.Logf("steps=%d %v %v: max |result − x0*| = %.3g", tc.steps, tc.variant, tc.dtype, worst)
			if worst > 2e-6 {
				t.Fatalf("result misses x0* by %g", worst)
			}
		})
	}
}

// gaussian is data N(m, s²) per element under the flow x_σ = (1−σ)x0 + σε: the posterior mean
// is exact, v = (x − E[x0|x])/σ, and the probability-flow ODE keeps the standardised value
// z = (x − (1−σ)m)/S(σ), S² = (1−σ)²s² + σ², so x(σ) = (1−σ)m + S(σ)z.
type gaussian struct{ m, s float64 }

func (g gaussian) S(sigma float64) float64 {
	return math.Sqrt((1-sigma)*(1-sigma)*g.s*g.s + sigma*sigma)
}

func (g gaussian) x0hat(x, sigma float64) float64 {
	S := g.S(sigma)
	return g.m + (1-sigma)*g.s*g.s/(S*S)*(x-(1-sigma)*g.m)
}

func (g gaussian) model() *funcModel {
	return &funcModel{f: func(in ForwardInput) []float32 {
		sigma := float64(in.Sigma)
		v := make([]float32, len(in.X))
		for i, x := range in.X {
			v[i] = float32((float64(x) - g.x0hat(float64(x), sigma)) / sigma)
		}
		return v
	}}
}

// gaussianError integrates the Gaussian flow from σ = 1 to σ = 0.01 with n sigmas spaced
// evenly in λ = −ln σ (plus the final 0, never evaluated) and returns the largest error of the
// final x against the exact solution, and of the result (the data prediction made at the last
// step, at the predicted point) against the exact posterior mean there.
func gaussianError(t *testing.T, g gaussian, n int, variant Variant) (xErr, resultErr float64) {
	t.Helper()
	shape := Shape{1, 1, 1, 8, 8}
	noise := make([]float32, shape.Numel())
	for i := range noise {
		noise[i] = float32(-2.5 + 5*float64(i)/float64(len(noise)-1))
	}
	sigmas := make([]float32, n+1)
	for i := 0; i < n; i++ {
		sigmas[i] = float32(math.Exp(-math.Log(100) * float64(i) / float64(n-1)))
	}
	den, err := FlowMatchDenoiser(g.model(), shape, &Conditioning{}, nil, Guidance{CFG: 1}, F32)
	if err != nil {
		t.Fatal(err)
	}
	var lastX []float32
	out, err := UniPC(t.Context(), den, noise, sigmas, variant, func(s StepInfo) error {
		lastX = append(lastX[:0], s.X...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sigma := float64(sigmas[n-1])
	for i, x := range noise {
		z := float64(x) / g.S(float64(sigmas[0]))
		exact := (1-sigma)*g.m + g.S(sigma)*z
		xErr = math.Max(xErr, math.Abs(float64(lastX[i])-exact))
		resultErr = math.Max(resultErr, math.Abs(float64(out[i])-g.x0hat(exact, sigma)))
	}
	return xErr, resultErr
}

// UniPC against the closed-form Gaussian flow: with steps even in λ the error falls at third
// order (order 3, its predictor-corrector lifting each order by one, but the order-1 and order-2
// warm-up steps limit the global order to 3). Single doublings are pre-asymptotic (bh2 shows
// 2.6 from 20 to 40 in float64 too), so the bound is on the order over 10 → 40 sigmas, with a
// looser one per doubling. FramePack's own schedule (linear in t, then shifted) keeps a last
// step of fixed size in λ, so its end point is only first order; this measures the integrator.
func TestUniPCGaussianConvergence(t *testing.T) {
	g := gaussian{m: 0.7, s: 0.25}
	for _, variant := range []Variant{BH1, BH2} {
		var first, prevX, prevR float64
		for _, n := range []int{10, 20, 40} {
			ex, er := gaussianError(t, g, n, variant)
			if prevX != 0 {
				rx, rr := math.Log2(prevX/ex), math.Log2(prevR/er)
				t.Logf("%v n=%2d max error x %.3g (order %.2f), result %.3g (order %.2f)", variant, n, ex, rx, er, rr)
				if rx < 2 || rr < 2 {
					t.Errorf("%v: %d → %d sigmas: observed order x %.2f, result %.2f, want ≥ 2", variant, n/2, n, rx, rr)
				}
			} else {
				first = ex
				t.Logf("%v n=%2d max error x %.3g, result %.3g", variant, n, ex, er)
			}
			prevX, prevR = ex, er
		}
		order := math.Log2(first/prevX) / 2
		t.Logf("%v: order over 10 → 40 sigmas %.2f", variant, order)
		if order < 2.9 {
			t.Errorf("%v: order %.2f over 10 → 40 sigmas, want ≥ 2.9", variant, order)
		}
		if prevX > 5e-5 || prevR > 5e-5 {
			t.Errorf("%v: 40 sigmas still off by %g (x), %g (result)", variant, prevX, prevR)
		}
	}
}

func TestSampleModelCallsAndOrder(t *testing.T) {
	for _, tc := range []struct {
		steps, order int
		cfg          float64
		calls        int
	}{
		{1, 0, 1, 1}, {2, 1, 1, 2}, {3, 2, 1, 3}, {4, 3, 1, 4}, {25, 3, 1, 25}, {3, 2, 2, 6},
	} {
		shape := Shape{1, 2, 1, 2, 2}
		plan, err := PlanFor(shape, Options{Steps: tc.steps})
		if err != nil {
			t.Fatal(err)
		}
		if plan.Order != tc.order {
			t.Errorf("steps %d: order %d, want %d", tc.steps, plan.Order, tc.order)
		}
		m := pointModel(make([]float32, shape.Numel()))
		_, err = Sample(t.Context(), m, Request{Noise: make([]float32, shape.Numel()), Shape: shape,
			Positive: &Conditioning{}, Negative: &Conditioning{},
			Options: Options{Steps: tc.steps, Guidance: Guidance{Distilled: 10, CFG: tc.cfg}}})
		if err != nil {
			t.Fatal(err)
		}
		if len(m.calls) != tc.calls {
			t.Errorf("steps %d cfg %v: %d model calls, want %d", tc.steps, tc.cfg, len(m.calls), tc.calls)
		}
	}
}

type teaModel struct {
	*funcModel
	enable    bool
	steps     int
	threshold float64
	inits     int
}

func (m *teaModel) InitializeTeaCache(enable bool, numSteps int, th float64) {
	m.enable, m.steps, m.threshold = enable, numSteps, th
	m.inits++
}

func TestSampleInitializesTeaCache(t *testing.T) {
	shape := Shape{1, 1, 1, 1, 4}
	req := Request{Noise: make([]float32, 4), Shape: shape, Positive: &Conditioning{}, Options: DefaultOptions()}
	req.Steps = 5
	for _, enable := range []bool{true, false} {
		m := &teaModel{funcModel: pointModel(make([]float32, 4))}
		req.TeaCache = enable
		if _, err := Sample(t.Context(), m, req); err != nil {
			t.Fatal(err)
		}
		if m.inits != 1 || m.enable != enable || m.steps != 5 || m.threshold != DefaultTeaCacheThreshold {
			t.Fatalf("TeaCache init %+v", m)
		}
	}
	req.TeaCache = true
	if _, err := Sample(t.Context(), pointModel(make([]float32, 4)), req); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("TeaCache on a model without it: %v", err)
	}
}

func TestSampleRejectsBadRequests(t *testing.T) {
	shape := Shape{1, 1, 1, 2, 2}
	good := Request{Noise: make([]float32, 4), Shape: shape, Positive: &Conditioning{}, Options: DefaultOptions()}
	for _, tc := range []struct {
		name string
		edit func(r *Request)
	}{
		{"noise size", func(r *Request) { r.Noise = r.Noise[:3] }},
		{"zero steps", func(r *Request) { r.Steps = 0 }},
		{"bad shape", func(r *Request) { r.Shape = Shape{1, 0, 1, 2, 2} }},
		{"cfg without negative", func(r *Request) { r.Guidance.CFG = 2 }},
		{"no positive", func(r *Request) { r.Positive = nil }},
		{"negative shift", func(r *Request) { r.Shift = -1 }},
		{"nan guidance", func(r *Request) { r.Guidance.Distilled = math.NaN() }},
		{"bad variant", func(r *Request) { r.Variant = 7 }},
		{"bad dtype", func(r *Request) { r.DType = 9 }},
		{"initial latent size", func(r *Request) { r.InitialLatent = []float32{1}; r.Strength = 0.5 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := good
			tc.edit(&r)
			if _, err := Sample(t.Context(), pointModel(make([]float32, 4)), r); !errors.Is(err, ErrBadRequest) {
				t.Fatalf("err %v, want ErrBadRequest", err)
			}
		})
	}
}

func TestSampleStopsOnCallbackErrorAndCancel(t *testing.T) {
	shape := Shape{1, 1, 1, 2, 2}
	stop := errors.New("user ended the task")
	req := Request{Noise: make([]float32, 4), Shape: shape, Positive: &Conditioning{}, Options: DefaultOptions()}
	req.OnStep = func(s StepInfo) error {
		if s.Step == 2 {
			return stop
		}
		return nil
	}
	m := pointModel(make([]float32, 4))
	if _, err := Sample(t.Context(), m, req); !errors.Is(err, stop) {
		t.Fatalf("err %v, want the callback's", err)
	}
	if len(m.calls) != 3 {
		t.Fatalf("%d model calls after stopping at step 2", len(m.calls))
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	req.OnStep = nil
	if _, err := Sample(ctx, m, req); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
}

func TestInitialLatentAndStrength(t *testing.T) {
	shape := Shape{1, 1, 1, 1, 2}
	target := []float32{0.25, -0.5}
	m := pointModel(target)
	var first []float32
	req := Request{Noise: []float32{1, 2}, Shape: shape, Positive: &Conditioning{},
		Options: Options{Steps: 4, Shift: 1, Guidance: Guidance{CFG: 1}, DType: F32,
			InitialLatent: []float32{3, 4}, Strength: 0.5}}
	req.OnStep = func(s StepInfo) error {
		if s.Step == 0 {
			first = append([]float32(nil), s.X...)
			if s.Sigma != 0.5 {
				t.Errorf("first sigma %v, want 0.5", s.Sigma)
			}
		}
		return nil
	}
	out, err := Sample(t.Context(), m, req)
	if err != nil {
		t.Fatal(err)
	}
	if first[0] != 2 || first[1] != 3 { // 3·0.5 + 1·0.5, 4·0.5 + 2·0.5
		t.Fatalf("start %v, want [2 3]", first)
	}
	if math.Abs(float64(out[0]-target[0])) > 1e-6 || math.Abs(float64(out[1]-target[1])) > 1e-6 {
		t.Fatalf("result %v, want %v", out, target)
	}
}

func TestScheduleBasics(t *testing.T) {
	if mu := FluxMu(1_000_000); mu != math.Log(7) {
		t.Fatalf("mu for a long sequence %v, want ln 7", mu)
	}
	if mu := FluxMu(256); math.Abs(mu-0.5) > 1e-15 {
		t.Fatalf("mu(256) = %v", mu)
	}
	if mu := FluxMu(4096); math.Abs(mu-1.15) > 1e-15 {
		t.Fatalf("mu(4096) = %v", mu)
	}
	// The 640 bucket section: 1×16×9×68×88 → 13464 tokens.
	if s := SeqLength(LatentShape(1, 704, 544, 33)); s != 13464 {
		t.Fatalf("seq length %d", s)
	}
	for _, steps := range []int{1, 2, 7, 25, 64} {
		s, err := Sigmas(steps, FluxMu(13464))
		if err != nil {
			t.Fatal(err)
		}
		if len(s) != steps+1 || math.Abs(float64(s[0])-1) > 1e-6 || s[steps] != 0 {
			t.Fatalf("steps %d: %v", steps, s)
		}
		for i := 1; i < len(s); i++ {
			if !(s[i] < s[i-1]) {
				t.Fatalf("steps %d: sigmas not decreasing at %d: %v", steps, i, s)
			}
		}
	}
	// shift 1 (mu 0) leaves linspace as it is.
	s, _ := Sigmas(4, ShiftMu(1))
	for i, want := range []float32{1, 0.75, 0.5, 0.25, 0} {
		if math.Abs(float64(s[i]-want)) > 1e-7 {
			t.Fatalf("shift 1 sigmas %v", s)
		}
	}
}

func TestSolve32(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	for trial := 0; trial < 200; trial++ {
		n := 1 + trial%3
		A := make([][]float32, n)
		xTrue := make([]float64, n)
		for i := range A {
			A[i] = make([]float32, n)
			for j := range A[i] {
				A[i][j] = float32(rng.NormFloat64())
			}
			A[i][i] += 3
			xTrue[i] = rng.NormFloat64()
		}
		b := make([]float32, n)
		for i := range b {
			var s float64
			for j := range xTrue {
				s += float64(A[i][j]) * xTrue[j]
			}
			b[i] = float32(s)
		}
		x, err := solve32(A, b)
		if err != nil {
			t.Fatal(err)
		}
		for i := range x {
			if math.Abs(float64(x[i])-xTrue[i]) > 1e-5*(1+math.Abs(xTrue[i])) {
				t.Fatalf("n=%d: x %v, want %v", n, x, xTrue)
			}
		}
	}
	if _, err := solve32([][]float32{{1, 2}, {2, 4}}, []float32{1, 2}); err == nil {
		t.Fatal("singular system solved")
	}
}

func TestParseNames(t *testing.T) {
	for _, s := range []string{"bfloat16", "float16", "float32", "float64"} {
		d, err := ParseDType(s)
		if err != nil || d.String() != s {
			t.Fatalf("ParseDType(%q) = %v, %v", s, d, err)
		}
	}
	if _, err := ParseDType("int8"); err == nil {
		t.Fatal("int8 parsed")
	}
	for _, s := range []string{"bh1", "bh2"} {
		v, err := ParseVariant(s)
		if err != nil || v.String() != s {
			t.Fatalf("ParseVariant(%q) = %v, %v", s, v, err)
		}
	}
	if _, err := ParseVariant("bh3"); !errors.Is(err, ErrBadRequest) {
		t.Fatal("bh3 parsed")
	}
}
