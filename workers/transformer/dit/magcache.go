package dit

import (
	"fmt"
	"math"
	"slices"

	"github.com/framepackd/framepackd/internal/runtime"
)

// MagCache defaults: FramePack-Studio's (modules/interface.py sliders and MagCache.__init__):
// threshold 0.1, two skips in a row at most, the first quarter of the steps always computed.
const (
	DefaultMagCacheThreshold      = 0.1
	DefaultMagCacheMaxSkips       = 2
	DefaultMagCacheRetentionRatio = 0.25
	// magCacheMaxRatioJump is the reference's fixed bound on a step's own ratio: a step whose
	// |1 − ratio| exceeds it always computes.
	magCacheMaxRatioJump = 0.06
)

// MagCacheCalibration names one of the reference's tables of magnitude ratios.
type MagCacheCalibration int

// Calibrations (worker.proto MagCacheCalibration; MAG_RATIOS_DB's model families).
const (
	MagCacheUncalibrated MagCacheCalibration = iota
	// MagCacheFramePack is MAG_RATIOS_DB["Original"]: FramePack's i2v transformer.
	MagCacheFramePack
	// MagCacheFramePackF1 is MAG_RATIOS_DB["F1"]: the FramePack-F1 transformer.
	MagCacheFramePackF1
)

func (c MagCacheCalibration) String() string {
	switch c {
	case MagCacheFramePack:
		return "framepack"
	case MagCacheFramePackF1:
		return "framepack_f1"
	}
	return fmt.Sprintf("calibration(%d)", int(c))
}

// magRatioGroup is one resolution group of a calibration.
type magRatioGroup struct {
	resolution int
	steps      []magRatioTable
}

// magRatioTable is the ratios calibrated at one step count.
type magRatioTable struct {
	steps  int
	ratios []float64
}

// MagCacheSettings are MagCache's settings for one section (worker.proto MagCacheSettings, the
// defaults filled in).
type MagCacheSettings struct {
	Calibration         MagCacheCalibration
	Threshold           float64
	MaxConsecutiveSkips int
	RetentionRatio      float64
}

// MagRatios returns the magnitude ratios MagCache uses for a section of steps steps at
// height × width pixels, as FramePack-Studio's MagCache._determine_mag_ratios chooses them: the
// resolution group closest to (height + width) / 2, in it the calibrated step count closest to
// steps (the first of a tie in the table's order), stretched to steps entries by nearest
// interpolation when the counts differ (indices round(i·(n−1)/(steps−1)), halves to even as
// numpy rounds).
func MagRatios(cal MagCacheCalibration, height, width, steps int) ([]float64, error) {
	groups, ok := magRatiosDB[cal]
	if !ok || len(groups) == 0 {
		return nil, fmt.Errorf("%w: no MagCache calibration %v", ErrInvalidInput, cal)
	}
	if steps < 1 {
		return nil, fmt.Errorf("%w: MagCache for %d steps", ErrInvalidInput, steps)
	}
	avg := float64(height+width) / 2
	g := groups[0]
	for _, c := range groups[1:] {
		if math.Abs(float64(c.resolution)-avg) < math.Abs(float64(g.resolution)-avg) {
			g = c
		}
	}
	t := g.steps[0]
	for _, c := range g.steps[1:] {
		if abs(c.steps-steps) < abs(t.steps-steps) {
			t = c
		}
	}
	if t.steps == steps {
		return slices.Clone(t.ratios), nil
	}
	n := len(t.ratios)
	if steps == 1 {
		return []float64{t.ratios[n-1]}, nil
	}
	scale := float64(n-1) / float64(steps-1)
	out := make([]float64, steps)
	for i := range out {
		out[i] = t.ratios[int(math.RoundToEven(float64(i)*scale))]
	}
	return out, nil
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// MagCacheSkips returns which of a section's steps MagCache skips (MagCache.should_skip over
// one section): steps before int(retention·steps), and step 0, always compute; from there the
// product of the ratios since the last computed step is accumulated into an error
// Σ|1 − product|, and a step is skipped while that error stays within the threshold, no more
// than maxSkips steps in a row are skipped, and the step's own ratio is within 0.06 of 1; a
// step that is not skipped starts the accumulation over. The rule reads only the calibrated
// ratios, never the model's state, so the pattern is known before sampling.
func MagCacheSkips(ratios []float64, threshold float64, maxSkips int, retention float64) []bool {
	steps := len(ratios)
	skip := make([]bool, steps)
	first := int(retention * float64(steps)) // Python's int(): towards zero
	accRatio, accErr, accSteps := 1.0, 0.0, 0
	for i := range steps {
		if i < first || i < 1 {
			continue
		}
		r := ratios[i]
		accRatio *= r
		accErr += math.Abs(1 - accRatio)
		accSteps++
		if accErr <= threshold && accSteps <= maxSkips && math.Abs(1-r) <= magCacheMaxRatioJump {
			skip[i] = true
			continue
		}
		accRatio, accErr, accSteps = 1, 0, 0
	}
	return skip
}

// MagCache is MagCache's state for one section's forwards of one branch (FramePack-Studio's
// diffusers_helper/models/mag_cache.py, installed in the packed transformer's forward): the
// blocks of a skipped step are not run, and the blocks' input plus the residual of the last
// computed step (its blocks' output − input) stands in for their output. Which steps skip comes
// from MagCacheSkips; the forwards are counted, wrapping after a section's steps. The reference
// counts every forward of the transformer, so with real CFG its two branches share (and mix) one
// counter; callers here keep one MagCache per branch, which is the reference's behaviour at
// cfg = 1 (FramePack's default) and keeps the branches apart otherwise.
type MagCache struct {
	Enabled bool
	// Skip says, per step, whether the blocks are skipped.
	Skip []bool

	cnt      int
	residual *runtime.Tensor

	// Calls records each forward's outcome.
	Calls []CacheCall
}

// CacheCall is one forward's block-cache outcome: whether the blocks ran, and TeaCache's
// accumulated distance after it (0 where they ran; always 0 for MagCache).
type CacheCall struct {
	Computed    bool
	Accumulated float64
}

// Reset starts a section over (MagCache._init_for_every_section) with settings s for steps
// steps at height × width pixels; enable false turns it off.
func (m *MagCache) Reset(enable bool, s MagCacheSettings, steps, height, width int) error {
	m.Close()
	*m = MagCache{}
	if !enable {
		return nil
	}
	if s.Threshold == 0 {
		s.Threshold = DefaultMagCacheThreshold
	}
	if s.MaxConsecutiveSkips == 0 {
		s.MaxConsecutiveSkips = DefaultMagCacheMaxSkips
	}
	ratios, err := MagRatios(s.Calibration, height, width, steps)
	if err != nil {
		return err
	}
	m.Enabled, m.Skip = true, MagCacheSkips(ratios, s.Threshold, s.MaxConsecutiveSkips, s.RetentionRatio)
	return nil
}

// Close frees the cached residual.
func (m *MagCache) Close() {
	if m.residual != nil {
		m.residual.Free()
		m.residual = nil
	}
}

// Skipped returns the number of forwards whose blocks were skipped.
func (m *MagCache) Skipped() int { return skippedCalls(m.Calls) }

func skippedCalls(calls []CacheCall) int {
	n := 0
	for _, c := range calls {
		if !c.Computed {
			n++
		}
	}
	return n
}

// decide is should_skip for the next forward; img is the blocks' input (its shape must match
// the cached residual's to reuse it).
func (m *MagCache) decide(img *runtime.Tensor) bool {
	calc := true
	if m.cnt < len(m.Skip) && m.Skip[m.cnt] {
		calc = false
	}
	if !calc && (m.residual == nil || !slices.Equal(m.residual.Shape(), img.Shape())) {
		calc = true
	}
	m.cnt++
	if m.cnt >= len(m.Skip) {
		m.cnt = 0
	}
	m.Calls = append(m.Calls, CacheCall{Computed: calc})
	return calc
}

func (m *MagCache) setResidual(r *runtime.Tensor) {
	if m.residual != nil {
		m.residual.Free()
	}
	m.residual = r
}
