package pipeline

import (
	"fmt"
	"testing"
	"time"
)

// etaRun plays a job of 3 sections against the ETA model on a simulated clock: per section
// 4 sampling steps of 1 s, then 1 s to start the VAE, 4 decode runs of 2 s and 1 s to write
// the video (a section's rest is 10 s). It returns, for every event the pipeline emits, the
// estimate, the true time left and the share reported.
type etaPoint struct {
	what       string
	est, truth time.Duration
	frac       float32
}

func etaRun(e *etaModel) []etaPoint {
	const (
		sections, steps, runs = 3, 4, 4
		step, vaeStart, run   = time.Second, time.Second, 2 * time.Second
		write                 = time.Second
	)
	section := time.Duration(steps)*step + vaeStart + time.Duration(runs)*run + write
	total := time.Duration(sections) * section
	var pts []etaPoint
	now := time.Duration(0)
	for i := range sections {
		start := now
		for k := 1; k <= steps; k++ {
			now += step
			e.stepDone(step)
			est, frac := e.estimate(i, k)
			pts = append(pts, etaPoint{fmt.Sprintf("section %d step %d", i, k), est, total - now, frac})
		}
		now += vaeStart
		decodeStart := now
		for k := 1; k <= runs; k++ {
			now += run
			est, frac := e.decodeEstimate(i, k, runs, now-decodeStart, now-start)
			pts = append(pts, etaPoint{fmt.Sprintf("section %d decode %d/%d", i, k, runs), est, total - now, frac})
		}
		now += write
		e.sectionDone(now - start)
	}
	return pts
}

// TestETADecode: the decode's progress feeds the estimate. From the first decode run of the
// first section on, every estimate is within 15% of the truth (or 2 s) and falls as time
// passes instead of jumping up when the section ends; the share done never goes back and
// ends at 1.
func TestETADecode(t *testing.T) {
	check := func(t *testing.T, pts []etaPoint, from int) {
		t.Helper()
		var last float32
		for k, p := range pts {
			if p.frac < last {
				t.Errorf("%s: share %.3f after %.3f", p.what, p.frac, last)
			}
			last = p.frac
			if k < from {
				continue
			}
			if d := (p.est - p.truth).Abs(); d > p.truth*15/100 && d > 2*time.Second {
				t.Errorf("%s: estimate %v, truth %v", p.what, p.est, p.truth)
			}
			if k > from && p.est > pts[k-1].est+time.Second {
				t.Errorf("%s: estimate jumped from %v to %v", p.what, pts[k-1].est, p.est)
			}
		}
		if last != 1 {
			t.Errorf("share at the end %.3f, want 1", last)
		}
	}
	t.Run("first job", func(t *testing.T) {
		pts := etaRun(&etaModel{steps: 4, sections: 3})
		check(t, pts, 4) // the first decode run of section 0 on
		for _, p := range pts {
			t.Logf("%-22s estimate %-6v truth %-6v share %.3f", p.what, p.est, p.truth, p.frac)
		}
	})
	t.Run("with the lane's prior", func(t *testing.T) {
		var memo restMemo
		k := restKey{lane: "cpu", height: 544, width: 704, window: 9}
		e := &etaModel{steps: 4, sections: 3}
		etaRun(e)
		memo.put(k, e.rest())
		next := &etaModel{steps: 4, sections: 3}
		next.setPrior(memo.get(k))
		check(t, etaRun(next), 0) // every estimate, the first step's included
	})
}
