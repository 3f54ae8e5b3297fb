package sampler

import (
	"context"
	"fmt"
	"math"
)

// Variant is UniPC's B(h) choice.
type Variant int

const (
	// BH1 is B(h) = h (FramePack's default).
	BH1 Variant = iota
	// BH2 is B(h) = e^h − 1.
	BH2
)

// String returns the reference's name of the variant.
func (v Variant) String() string {
	switch v {
	case BH1:
		return "bh1"
	case BH2:
		return "bh2"
	}
	return fmt.Sprintf("Variant(%d)", int(v))
}

// ParseVariant reads "bh1" or "bh2".
func ParseVariant(s string) (Variant, error) {
	switch s {
	case "bh1":
		return BH1, nil
	case "bh2":
		return BH2, nil
	}
	return 0, fmt.Errorf("%w: unknown UniPC variant %q", ErrBadRequest, s)
}

// StepInfo is what the per-step callback sees (the reference's callback dict): after step Step
// of Steps, the current latent X and the newest data prediction Denoised. Both slices belong to
// the sampler and are valid only during the callback.
type StepInfo struct {
	Step, Steps int
	Sigma       float32
	X           []float32
	Denoised    []float32
}

// StepFunc is called after every step; an error stops sampling and is returned (wrapped).
type StepFunc func(StepInfo) error

// MaxOrder is the reference's UniPC order cap.
const MaxOrder = 3

// UniPC is FlowMatchUniPC.sample: flow-matching UniPC over sigmas (evaluated at every sigma but
// the last, which is 0), order min(3, len(sigmas)−2) with order i at step i < order, no lowering
// at the end. x is not modified. It returns the last data prediction, as the reference does.
func UniPC(ctx context.Context, denoise Denoiser, x []float32, sigmas []float32, variant Variant, onStep StepFunc) ([]float32, error) {
	if len(sigmas) < 2 {
		return nil, fmt.Errorf("%w: %d sigmas, need at least 2", ErrBadRequest, len(sigmas))
	}
	if variant != BH1 && variant != BH2 {
		return nil, fmt.Errorf("%w: variant %v", ErrBadRequest, variant)
	}
	for i, s := range sigmas[:len(sigmas)-1] {
		if !(s > 0) || math.IsInf(float64(s), 0) {
			return nil, fmt.Errorf("%w: sigma[%d] = %v is not positive and finite", ErrBadRequest, i, s)
		}
	}
	steps := len(sigmas) - 1
	order := min(MaxOrder, len(sigmas)-2)
	x = append([]float32(nil), x...)
	var ts []float32   // t_prev_list
	var ms [][]float32 // model_prev_list
	for i := 0; i < steps; i++ {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("unipc step %d: %w", i, err)
		}
		t := sigmas[i]
		if i == 0 {
			m, err := denoise(ctx, x, t, i)
			if err != nil {
				return nil, fmt.Errorf("unipc step %d: %w", i, err)
			}
			ts, ms = []float32{t}, [][]float32{m}
		} else {
			o := order
			if i < order {
				o = i
			}
			var m []float32
			var err error
			x, m, err = uniPCUpdate(ctx, denoise, x, ms, ts, t, o, variant, i)
			if err != nil {
				return nil, fmt.Errorf("unipc step %d: %w", i, err)
			}
			ts, ms = append(ts, t), append(ms, m)
		}
		// model_prev_list[-order:]; order 0 (one step) keeps everything.
		if order > 0 && len(ms) > order {
			ts, ms = ts[len(ts)-order:], ms[len(ms)-order:]
		}
		if onStep != nil {
			if err := onStep(StepInfo{Step: i, Steps: steps, Sigma: t, X: x, Denoised: ms[len(ms)-1]}); err != nil {
				return nil, fmt.Errorf("unipc step %d callback: %w", i, err)
			}
		}
	}
	return ms[len(ms)-1], nil
}

func log32(x float32) float32   { return float32(math.Log(float64(x))) }
func expm132(x float32) float32 { return float32(math.Expm1(float64(x))) }

// uniPCUpdate is FlowMatchUniPC.update_fn: one predictor (order o) step from the newest entry of
// ms/ts to t, the model at the predicted point, then the corrector; all in float32.
func uniPCUpdate(ctx context.Context, denoise Denoiser, x []float32, ms [][]float32, ts []float32, t float32, o int, variant Variant, step int) ([]float32, []float32, error) {
	if o < 1 || o > len(ms) {
		return nil, nil, fmt.Errorf("order %d with %d previous predictions", o, len(ms))
	}
	last := len(ms) - 1
	tp0, m0 := ts[last], ms[last]
	lp0 := -log32(tp0)
	lt := -log32(t)
	h := lt - lp0

	rks := make([]float32, 0, o)
	d1s := make([][]float32, 0, o-1)
	for i := 1; i < o; i++ {
		lpi := -log32(ts[last-i])
		rk := (lpi - lp0) / h
		rks = append(rks, rk)
		mi := ms[last-i]
		d := make([]float32, len(x))
		for j := range d {
			d[j] = (mi[j] - m0[j]) / rk
		}
		d1s = append(d1s, d)
	}
	rks = append(rks, 1)

	hh := -h
	hPhi1 := expm132(hh)
	hPhiK := hPhi1/hh - 1
	factorial := 1
	bh := hh
	if variant == BH2 {
		bh = expm132(hh)
	}
	R := make([][]float32, o)
	b := make([]float32, o)
	for i := 1; i <= o; i++ {
		R[i-1] = make([]float32, o)
		for k, r := range rks {
			R[i-1][k] = pow32(r, i-1)
		}
		b[i-1] = float32(hPhiK*float32(factorial)) / bh
		factorial *= i + 1
		hPhiK = hPhiK/hh - float32(1.0/float64(factorial))
	}

	var rhosP, rhosC []float32
	var err error
	if len(d1s) > 0 {
		if o == 2 {
			rhosP = []float32{0.5}
		} else {
			sub := make([][]float32, o-1)
			for i := range sub {
				sub[i] = R[i][:o-1]
			}
			if rhosP, err = solve32(sub, b[:o-1]); err != nil {
				return nil, nil, fmt.Errorf("predictor coefficients: %w", err)
			}
		}
	}
	if o == 1 {
		rhosC = []float32{0.5}
	} else if rhosC, err = solve32(R, b); err != nil {
		return nil, nil, fmt.Errorf("corrector coefficients: %w", err)
	}

	ratio := t / tp0
	xt0 := make([]float32, len(x)) // x_t_
	for j := range x {
		xt0[j] = float32(ratio*x[j]) - float32(hPhi1*m0[j])
	}
	xt := xt0
	if len(d1s) > 0 {
		xt = make([]float32, len(x))
		for j := range xt {
			xt[j] = xt0[j] - float32(bh*tensordot(d1s, rhosP, j))
		}
	}
	mt, err := denoise(ctx, xt, t, step)
	if err != nil {
		return nil, nil, err
	}
	if len(mt) != len(x) {
		return nil, nil, fmt.Errorf("denoiser returned %d values, want %d", len(mt), len(x))
	}
	rc := rhosC[len(rhosC)-1]
	out := make([]float32, len(x))
	for j := range out {
		var corr float32
		if len(d1s) > 0 {
			corr = tensordot(d1s, rhosC[:len(rhosC)-1], j)
		}
		d1t := mt[j] - m0[j]
		out[j] = xt0[j] - float32(bh*(corr+float32(rc*d1t)))
	}
	return out, mt, nil
}

// tensordot is torch.tensordot(D1s, rhos, dims=([1], [0])) at element j: Σ_k D1s[k][j]·rhos[k].
func tensordot(d1s [][]float32, rhos []float32, j int) float32 {
	var s float32
	for k, r := range rhos {
		s += float32(d1s[k][j] * r)
	}
	return s
}

// pow32 is torch.pow(x, e) for the small integer exponents UniPC uses, in float32.
func pow32(x float32, e int) float32 {
	p := float32(1)
	for i := 0; i < e; i++ {
		p = float32(p * x)
	}
	return p
}

// solve32 is torch.linalg.solve on a tiny float32 system: LU with partial pivoting (pivot
// column scaled by the pivot's reciprocal, as LAPACK's sgetrf2), then forward and back
// substitution (sgetrs).
func solve32(A [][]float32, rhs []float32) ([]float32, error) {
	n := len(A)
	a := make([][]float32, n)
	for i := range A {
		if len(A[i]) != n {
			return nil, fmt.Errorf("matrix is not square")
		}
		a[i] = append([]float32(nil), A[i]...)
	}
	x := append([]float32(nil), rhs...)
	for k := 0; k < n; k++ {
		p := k
		for i := k + 1; i < n; i++ {
			if abs32(a[i][k]) > abs32(a[p][k]) {
				p = i
			}
		}
		if a[p][k] == 0 {
			return nil, fmt.Errorf("singular matrix")
		}
		a[k], a[p] = a[p], a[k]
		x[k], x[p] = x[p], x[k]
		inv := 1 / a[k][k]
		for i := k + 1; i < n; i++ {
			a[i][k] = float32(a[i][k] * inv)
		}
		for i := k + 1; i < n; i++ {
			for j := k + 1; j < n; j++ {
				a[i][j] -= float32(a[i][k] * a[k][j])
			}
		}
	}
	for k := 0; k < n; k++ { // L y = b, unit diagonal
		for i := k + 1; i < n; i++ {
			x[i] -= float32(x[k] * a[i][k])
		}
	}
	for k := n - 1; k >= 0; k-- { // U x = y
		x[k] /= a[k][k]
		for i := 0; i < k; i++ {
			x[i] -= float32(x[k] * a[i][k])
		}
	}
	for _, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("ill-conditioned system")
		}
	}
	return x, nil
}

func abs32(v float32) float32 { return float32(math.Abs(float64(v))) }
