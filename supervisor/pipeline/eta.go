package pipeline

import (
	"sync"
	"time"
)

// etaModel estimates the time left in a job, and the share of it done, from what it measured
// so far: the mean sampling step, and the mean rest of a section (spawn, load, VAE decode,
// video), the section's wall time minus its steps. Until a section has ended, the rest is
// the rest an earlier job of the same shape measured on the lane (prior), and during a VAE
// decode the decode's own progress (elapsed time over the share of its model runs done)
// projects the rest of this section and so of every later one, so the estimate moves with
// the decode instead of jumping when the first section ends.
type etaModel struct {
	steps, sections int

	// mu protects the fields below.
	mu             sync.Mutex
	stepSum        time.Duration
	stepN          int
	sectionStepSum time.Duration // steps of the current section
	restSum        time.Duration
	restN          int
	prior          time.Duration // a section's rest from an earlier job (restMemo); 0: none
	fraction       float64       // the highest share reported, so it never goes back
}

// stepDone records one sampling step.
func (e *etaModel) stepDone(d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stepSum += d
	e.stepN++
	e.sectionStepSum += d
}

// sectionDone records a finished section's wall time and returns its rest (wall minus
// steps; 0 when the steps took all of it).
func (e *etaModel) sectionDone(wall time.Duration) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	rest := wall - e.sectionStepSum
	if rest > 0 {
		e.restSum += rest
		e.restN++
	}
	e.sectionStepSum = 0
	return max(rest, 0)
}

// setPrior sets the rest of a section an earlier job measured, used until this job's first
// section ends.
func (e *etaModel) setPrior(rest time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.prior = rest
}

// rest is the expected rest of a section: the mean measured, else the prior, else 0.
// The caller holds mu.
func (e *etaModel) rest() time.Duration {
	if e.restN > 0 {
		return e.restSum / time.Duration(e.restN)
	}
	return e.prior
}

// stepTime is the expected sampling time of a whole section; the caller holds mu.
func (e *etaModel) stepTime() time.Duration {
	if e.stepN == 0 {
		return 0
	}
	return time.Duration(e.steps) * (e.stepSum / time.Duration(e.stepN))
}

// estimate is the time left after step (1-based) of section (0-based), and the share of the
// job done: the remaining steps of this and later sections at the mean step time, plus the
// rest of this and every later section.
func (e *etaModel) estimate(section, step int) (time.Duration, float32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stepN == 0 {
		return 0, float32(e.fraction)
	}
	later := max(e.sections-section-1, 0)
	stepsLeft := max(e.steps-step, 0) + later*e.steps
	left := time.Duration(stepsLeft)*(e.stepSum/time.Duration(e.stepN)) + time.Duration(later+1)*e.rest()
	inSection := e.samplingShare(e.rest()) * float64(min(step, e.steps)) / float64(max(e.steps, 1))
	return left, e.share(section, inSection)
}

// decodeEstimate is the time left, and the share of the job done, while section's VAE decode
// has finished done of its total model runs in elapsed, sectionWall after the section began.
// The decode's left is elapsed × (total − done) / done; the section's rest is the mean one
// when a section has ended, else what this one has spent since its steps plus the decode's
// left.
func (e *etaModel) decodeEstimate(section, done, total int, elapsed, sectionWall time.Duration) (time.Duration, float32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if done < 1 || total < 1 {
		return 0, float32(e.fraction)
	}
	done = min(done, total)
	decodeLeft := time.Duration(float64(elapsed) * float64(total-done) / float64(done))
	rest := e.rest()
	if e.restN == 0 {
		rest = max(sectionWall-e.sectionStepSum, 0) + decodeLeft
	}
	later := max(e.sections-section-1, 0)
	left := decodeLeft + time.Duration(later)*(e.stepTime()+rest)
	s := e.samplingShare(rest)
	return left, e.share(section, s+(1-s)*float64(done)/float64(total))
}

// samplingShare is the part of a section's time its sampling takes, given its rest; 1 while
// nothing is known about the rest. The caller holds mu.
func (e *etaModel) samplingShare(rest time.Duration) float64 {
	st := e.stepTime()
	if st <= 0 || rest <= 0 {
		return 1
	}
	return float64(st) / float64(st+rest)
}

// share is the job's share done with inSection (0 to 1) of section done, never less than
// one reported before. The caller holds mu.
func (e *etaModel) share(section int, inSection float64) float32 {
	f := (float64(section) + min(max(inSection, 0), 1)) / float64(max(e.sections, 1))
	e.fraction = max(e.fraction, min(f, 1))
	return float32(e.fraction)
}

// restMemo remembers, per lane and job shape, the rest of a section (see etaModel) the last
// job measured, so the next job's first section has an estimate of its decode. It is safe
// for concurrent use; the zero value is empty.
type restMemo struct {
	mu   sync.Mutex
	rest map[restKey]time.Duration
}

// restKey is what a section's rest depends on: the lane and the size of what is decoded.
type restKey struct {
	lane                  string
	height, width, window int
}

func (m *restMemo) get(k restKey) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rest[k]
}

func (m *restMemo) put(k restKey, d time.Duration) {
	if d <= 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rest == nil {
		m.rest = map[restKey]time.Duration{}
	}
	m.rest[k] = d
}
