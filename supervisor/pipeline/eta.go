package pipeline

import (
	"sync"
	"time"
)

// etaModel estimates the time left in a job from what it measured so far: the mean sampling
// step and the mean rest of a section (spawn, load, decode, video), the section's wall time
// minus its steps.
type etaModel struct {
	steps, sections int

	// mu protects the sums below.
	mu             sync.Mutex
	stepSum        time.Duration
	stepN          int
	sectionStepSum time.Duration // steps of the current section
	restSum        time.Duration
	restN          int
}

// stepDone records one sampling step.
func (e *etaModel) stepDone(d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stepSum += d
	e.stepN++
	e.sectionStepSum += d
}

// sectionDone records a finished section's wall time.
func (e *etaModel) sectionDone(wall time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if rest := wall - e.sectionStepSum; rest > 0 {
		e.restSum += rest
		e.restN++
	}
	e.sectionStepSum = 0
}

// estimate is the time left after step (1-based) of section (0-based): the remaining steps
// of this and later sections at the mean step time, plus the rest of this and every later
// section at the mean rest (unknown before the first section ends: then only steps count).
func (e *etaModel) estimate(section, step int) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stepN == 0 {
		return 0
	}
	later := max(e.sections-section-1, 0)
	stepsLeft := max(e.steps-step, 0) + later*e.steps
	left := time.Duration(stepsLeft) * (e.stepSum / time.Duration(e.stepN))
	if e.restN > 0 {
		left += time.Duration(later+1) * (e.restSum / time.Duration(e.restN))
	}
	return left
}
