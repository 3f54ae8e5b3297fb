package dit

import (
	"fmt"
	"slices"

	"github.com/framepackd/framepackd/internal/runtime"
)

// DefaultTeaCacheThreshold is the reference's rel_l1_thresh (0.15: about 2.1× faster).
const DefaultTeaCacheThreshold = 0.15

// teaCacheRescale is the reference's np.poly1d rescale of the relative L1 change, highest power
// first.
var teaCacheRescale = [5]float64{7.33226126e+02, -4.01131952e+02, 6.75869174e+01, -3.14987800e+00, 9.61237896e-02}

func rescaleRelL1(x float64) float64 {
	y := 0.0
	for _, c := range teaCacheRescale {
		y = y*x + c
	}
	return y
}

// TeaCache is FramePack's TeaCache state for one sequence of forwards (the reference model's
// initialize_teacache fields). Each forward compares transformer_blocks[0].norm1's modulated
// image input with the previous forward's: the rescaled relative L1 change accumulates, and while
// the sum stays under Threshold the blocks are skipped and the last computed residual
// (blocks' output − input) is added instead. The first and last of NumSteps forwards always
// compute. The reference counts forwards (its cnt wraps at NumSteps); with real CFG it shares one
// state between both branches, which mixes them — callers here keep one TeaCache per branch, which
// is the reference's behaviour for cfg = 1 (FramePack's setting) and keeps branches apart
// otherwise.
type TeaCache struct {
	Enabled   bool
	NumSteps  int
	Threshold float64

	cnt      int
	acc      float64
	prev     []float32
	residual *runtime.Tensor

	// Calls records each forward: whether the blocks ran and the accumulated distance after it
	// (0 where they ran), as the reference's accumulated_rel_l1_distance.
	Calls []CacheCall
}

// NewTeaCache returns an enabled TeaCache for numSteps forwards; threshold 0 means 0.15.
func NewTeaCache(numSteps int, threshold float64) *TeaCache {
	if threshold == 0 {
		threshold = DefaultTeaCacheThreshold
	}
	return &TeaCache{Enabled: true, NumSteps: numSteps, Threshold: threshold}
}

// Reset starts over (initialize_teacache) with new settings, freeing the cached residual.
func (t *TeaCache) Reset(enable bool, numSteps int, threshold float64) {
	t.Close()
	if threshold == 0 {
		threshold = DefaultTeaCacheThreshold
	}
	*t = TeaCache{Enabled: enable, NumSteps: numSteps, Threshold: threshold}
}

// Close frees the cached residual.
func (t *TeaCache) Close() {
	if t.residual != nil {
		t.residual.Free()
		t.residual = nil
	}
	t.prev = nil
}

// Skipped returns the number of forwards whose blocks were skipped.
func (t *TeaCache) Skipped() int { return skippedCalls(t.Calls) }

// decide is the reference's should_calc for modulated input mod; img is the blocks' input (its
// shape must match the cached residual's to reuse it).
func (t *TeaCache) decide(mod, img *runtime.Tensor) (bool, error) {
	cur, err := mod.Float32()
	if err != nil {
		return false, fmt.Errorf("teacache: %w", err)
	}
	calc := true
	if t.cnt == 0 || t.cnt == t.NumSteps-1 || t.prev == nil || len(t.prev) != len(cur) {
		t.acc = 0
	} else {
		var num, den float64
		for i, v := range cur {
			d := float64(v) - float64(t.prev[i])
			if d < 0 {
				d = -d
			}
			num += d
			pv := float64(t.prev[i])
			if pv < 0 {
				pv = -pv
			}
			den += pv
		}
		t.acc += rescaleRelL1(num / den)
		calc = t.acc >= t.Threshold
		if calc {
			t.acc = 0
		}
	}
	if !calc && (t.residual == nil || !slices.Equal(t.residual.Shape(), img.Shape())) {
		calc, t.acc = true, 0
	}
	t.prev = cur
	t.cnt++
	if t.cnt == t.NumSteps {
		t.cnt = 0
	}
	t.Calls = append(t.Calls, CacheCall{Computed: calc, Accumulated: t.acc})
	return calc, nil
}

func (t *TeaCache) setResidual(r *runtime.Tensor) {
	if t.residual != nil {
		t.residual.Free()
	}
	t.residual = r
}
