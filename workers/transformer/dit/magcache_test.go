package dit

import (
	"slices"
	"testing"
)

// TestMagCacheSkips checks the skipped steps against patterns derived from FramePack-Studio's
// MagCache.should_skip (f4369da) and its MAG_RATIOS_DB. The first case by hand: group 640
// ((544 + 704) / 2 = 624), 25 steps, retention int(0.25·25) = 6. Step 6: ratio 1.02344, product
// 1.02344, error 0.02344 ≤ 0.1, 1 skip ≤ 2, |1 − 1.02344| ≤ 0.06: skipped. Step 7: 1.03906,
// product 1.06344, error 0.08688, 2 skips: skipped. Step 8: 1.05469, product 1.12160, error
// 0.20848 > 0.1: computed, the accumulation starts over. Step 9 (1.02344) and 10 (1.03906) repeat
// steps 6 and 7, and so on in pairs. At the end: step 20 computes (a third in a row), step 21
// (0.98828) errs 0.01172 and step 22 (0.94531, within 0.06 of 1) 0.07749: both skipped; step 23
// would be a third skip in a row, and step 24 (0.78516) errs 0.21484.
func TestMagCacheSkips(t *testing.T) {
	for _, c := range []struct {
		name                string
		cal                 MagCacheCalibration
		height, width       int
		steps               int
		threshold           float64
		maxSkips            int
		retention           float64
		want                []int
		group, stepsInTable int
	}{
		{"framepack 640 25 steps, Studio's defaults", MagCacheFramePack, 544, 704, 25, 0.1, 2, 0.25,
			[]int{6, 7, 9, 10, 12, 13, 15, 16, 18, 19, 21, 22}, 640, 25},
		{"f1 640 25 steps, Studio's defaults", MagCacheFramePackF1, 544, 704, 25, 0.1, 2, 0.25,
			[]int{6, 7, 9, 10, 12, 13, 15, 16, 18, 19, 21, 23}, 640, 25},
		{"tiny models, 3 steps stretched from 25", MagCacheFramePack, 32, 32, 3, 0.1, 2, 0.25, []int{1}, 128, 25},
		{"30 steps stretched from 25, threshold 0.2, 3 skips, retention 0.1", MagCacheFramePack, 544, 704, 30, 0.2, 3, 0.1,
			[]int{4, 5, 7, 8, 9, 11, 12, 13, 15, 16, 17, 19, 20, 21, 23, 24, 25, 27}, 640, 25},
		{"f1 tiny 10 steps", MagCacheFramePackF1, 32, 32, 10, 0.1, 2, 0.25, []int{2, 3, 5, 7, 8}, 128, 25},
		{"framepack tiny 10 steps", MagCacheFramePack, 32, 32, 10, 0.1, 2, 0.25, []int{2, 4, 5, 7}, 128, 25},
		// (640 + 768) / 2 = 704 is as far from 640 as from 768: the table's first group (768) wins.
		{"a tie between groups, 50 steps, 4 skips", MagCacheFramePack, 640, 768, 50, 0.15, 4, 0.2,
			[]int{10, 11, 12, 13, 15, 16, 17, 19, 20, 21, 22, 24, 25, 26, 27, 29, 30, 31, 32, 34, 35, 36, 37, 39, 40, 41, 42, 44, 45}, 768, 50},
		// 0.7·10 is 7.000000000000001 in float64: the first 7 steps compute.
		{"retention 0.7 of 10 steps", MagCacheFramePack, 480, 832, 10, 0.1, 2, 0.7, []int{7, 8}, 640, 25},
		{"retention 0: only step 0 always computes", MagCacheFramePackF1, 32, 32, 12, 0.25, 3, 0, []int{1, 2, 3, 5, 6}, 128, 25},
	} {
		t.Run(c.name, func(t *testing.T) {
			ratios, err := MagRatios(c.cal, c.height, c.width, c.steps)
			if err != nil {
				t.Fatal(err)
			}
			if len(ratios) != c.steps {
				t.Fatalf("%d ratios for %d steps", len(ratios), c.steps)
			}
			var got []int
			for i, s := range MagCacheSkips(ratios, c.threshold, c.maxSkips, c.retention) {
				if s {
					got = append(got, i)
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("skipped steps %v, want %v", got, c.want)
			}
			// The table the ratios came from.
			var table []float64
			for _, g := range magRatiosDB[c.cal] {
				if g.resolution == c.group {
					for _, s := range g.steps {
						if s.steps == c.stepsInTable {
							table = s.ratios
						}
					}
				}
			}
			if c.steps == c.stepsInTable && !slices.Equal(ratios, table) {
				t.Errorf("ratios are not group %d's %d-step table", c.group, c.stepsInTable)
			}
			if ratios[c.steps-1] != table[len(table)-1] || ratios[0] != 1 {
				t.Errorf("ratios %v do not start at 1 and end at the table's last (%v)", ratios, table[len(table)-1])
			}
		})
	}
}

// TestMagRatiosNearestInterpolation checks the stretch rounds halves to even as numpy's round
// does: 17 steps from 25 step by 1.5, so step 3 (4.5) reads table entry 4, not 5.
func TestMagRatiosNearestInterpolation(t *testing.T) {
	r, err := MagRatios(MagCacheFramePack, 32, 32, 17)
	if err != nil {
		t.Fatal(err)
	}
	// MAG_RATIOS_DB["Original"][128][25]: 1.0, 1.63281, 1.0625, 1.14062, 1.04688, 1.03906, …
	if r[1] != 1.0625 || r[2] != 1.14062 || r[3] != 1.04688 {
		t.Errorf("ratios 1..3 = %v, want table entries 2 (1.5 → 2), 3, 4 (4.5 → 4)", r[1:4])
	}
	one, err := MagRatios(MagCacheFramePackF1, 32, 32, 1)
	if err != nil || len(one) != 1 || one[0] != 0.83203 {
		t.Errorf("one step: %v, %v; want the table's last ratio 0.83203", one, err)
	}
	if _, err := MagRatios(MagCacheUncalibrated, 32, 32, 10); err == nil {
		t.Error("an unknown calibration gave ratios")
	}
}

// TestMagCacheDecideFollowsSkips checks the forward's decisions follow the pattern and wrap at
// the section's steps, and that a skip without a cached residual of the input's shape computes.
func TestMagCacheDecideFollowsSkips(t *testing.T) {
	var m MagCache
	if err := m.Reset(true, MagCacheSettings{Calibration: MagCacheFramePack}, 3, 32, 32); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m.Skip, []bool{false, true, false}) {
		t.Fatalf("skip pattern %v", m.Skip)
	}
	// No residual cached yet: step 1 computes although the pattern skips it.
	for range 3 {
		m.decide(nil)
	}
	if m.Skipped() != 0 || len(m.Calls) != 3 || m.cnt != 0 {
		t.Fatalf("calls %+v, counter %d", m.Calls, m.cnt)
	}
	if err := m.Reset(false, MagCacheSettings{}, 3, 32, 32); err != nil || m.Enabled {
		t.Fatalf("disabled reset: %v, enabled %v", err, m.Enabled)
	}
}
