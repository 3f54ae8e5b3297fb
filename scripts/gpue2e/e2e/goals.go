package main

import (
	"fmt"
	"strconv"
	"strings"
)

// Goal is one line of issue 30's goals table.
type Goal struct {
	Measure string `json:"measure"`
	// Ours and FramePack are the two sides in words (seconds, GiB), Result the measure's value
	// in words and Value as a number (a ratio, a share, GiB; 0 with Met nil: not measured).
	Ours      string  `json:"ours"`
	FramePack string  `json:"framepack,omitempty"`
	Result    string  `json:"result"`
	Value     float64 `json:"value"`
	Goal      string  `json:"goal"`
	Met       *bool   `json:"met,omitempty"`
}

// goalBudgets are the budgets issue 30 sets a goal against FramePack's low-VRAM mode at the
// same memory: the least speedup, and the most host RAM all our processes may hold.
var goalBudgets = []struct {
	budget  string
	speedup float64
}{{"16", 2.8}, {"6", 3.5}}

const (
	goalLoadShare    = 0.05
	goalLongTime     = 1.05
	goalLongWrites   = 3.0
	goalHostRSSGiB   = 32.0
	goalKeepVsHighFP = 1.0
)

func met(ok bool) *bool { return &ok }

// goals computes issue 30's table from the jobs and FramePack's runs. Times set side by side
// leave out our write-video stages where FramePack's job wrote no video (its wrote_video), and
// FramePack's model load from disk (its job starts with the models in host memory, as a
// long-lived FramePack's next job; ours includes every worker's load except for keep).
func goals(jobs []JobTotal, fp fpResults) []Goal {
	byName := map[string]*Budget{}
	var numeric []string
	job := "4 s job" // the short job's name in the measures: its length
	for i := range jobs {
		b := &jobs[i].Budget
		byName[b.Budget] = b
		if _, err := strconv.ParseFloat(b.Budget, 64); err == nil {
			numeric = append(numeric, b.Budget)
		}
		if b.Budget != "long" && b.Seconds > 0 {
			job = fmt.Sprintf("%g s job", b.Seconds)
		}
	}
	// ourTime is b's time to set beside FramePack's job r: with our video writing where r
	// wrote its video, else without.
	ourTime := func(b *Budget, r *fpRow) (float64, string) {
		if r != nil && r.WroteVideo {
			return b.TotalS, fmt.Sprintf("%.1f s with video (%.1f s without)", b.TotalS, b.TotalNoVideoS)
		}
		return b.TotalNoVideoS, fmt.Sprintf("%.1f s without video (%.1f s with)", b.TotalNoVideoS, b.TotalS)
	}
	fpTime := func(r *fpRow) string {
		v := "without video"
		if r.WroteVideo {
			v = "with video"
		}
		if r.Beside != "" {
			v += "; " + r.Beside
		}
		return fmt.Sprintf("%.1f s %s (+ %.1f s load)", r.Seconds, v, r.LoadS)
	}
	var out []Goal

	g := Goal{Measure: job + " where everything fits (keep-alive on, warm workers) vs FramePack high-VRAM", Goal: fmt.Sprintf("≤ %.1f× FramePack's time", goalKeepVsHighFP)}
	keep, high := byName["keep"], fp.job("high_vram", 0)
	if keep != nil && keep.OK {
		t, s := ourTime(keep, high)
		g.Ours = s
		if high != nil && high.Seconds > 0 && t > 0 {
			g.FramePack, g.Value = fpTime(high), t/high.Seconds
			g.Result = fmt.Sprintf("%.2f× FramePack's time", g.Value)
			g.Met = met(g.Value <= goalKeepVsHighFP)
		}
	}
	out = append(out, notRun(g))

	goalOf := map[string]float64{}
	for _, gb := range goalBudgets {
		goalOf[gb.budget] = gb.speedup
	}
	seen := map[string]bool{}
	for _, b := range append(append([]string{}, numeric...), "16", "6") {
		if seen[b] {
			continue
		}
		seen[b] = true
		want, hasGoal := goalOf[b]
		if !hasGoal && byName[b] == nil {
			continue
		}
		v, _ := strconv.ParseFloat(b, 64)
		g := Goal{Measure: fmt.Sprintf("%s at %s GB vs FramePack low-VRAM at %s GB", job, b, b), Goal: "–"}
		if hasGoal {
			g.Goal = fmt.Sprintf("≥ %.1f× faster", want)
		}
		ours, low := byName[b], fp.job("low_vram", v)
		if ours != nil && ours.OK {
			t, s := ourTime(ours, low)
			g.Ours = s
			if low != nil && t > 0 {
				g.FramePack, g.Value = fpTime(low), low.Seconds/t
				g.Result = fmt.Sprintf("%.2f× faster", g.Value)
				if hasGoal {
					g.Met = met(g.Value >= want)
				}
			}
		}
		out = append(out, notRun(g))
	}

	g = Goal{Measure: "load share of the 16 GB job (spawn → ready + load of every stage / job time)", Goal: fmt.Sprintf("≤ %.0f %%", 100*goalLoadShare)}
	if b := byName["16"]; b != nil && b.OK {
		g.Ours = fmt.Sprintf("%.1f s of %.1f s", b.LoadS, b.TotalS)
		g.Value, g.Result, g.Met = b.LoadShare, fmt.Sprintf("%.1f %%", 100*b.LoadShare), met(b.LoadShare <= goalLoadShare)
	}
	out = append(out, notRun(g))

	long := byName["long"]
	name := "60 s job at 16 GB"
	if long != nil {
		name = fmt.Sprintf("%g s job at %g GB (%d sections, %d steps)", long.Seconds, long.CapGiB, len(long.Sections), long.Steps)
	}
	g = Goal{Measure: name + ": total vs the sum of its sections' compute", Goal: fmt.Sprintf("finishes; ≤ %.2f×", goalLongTime)}
	g2 := Goal{Measure: name + ": bytes written to disk vs the final files", Goal: fmt.Sprintf("≤ %.0f×", goalLongWrites)}
	if long != nil && long.OK {
		l := summarizeLong(*long)
		g.Ours = fmt.Sprintf("%.1f s total, %.1f s sections' compute (%.1f s wall)", long.TotalS, long.SectionsComputeS, long.SectionsWallS)
		g.Value, g.Result, g.Met = l.TotalOverCompute, fmt.Sprintf("%.3f× (%.3f× the sections' wall)", l.TotalOverCompute, l.TotalOverWall), met(l.TotalOverCompute <= goalLongTime)
		g2.Ours = fmt.Sprintf("%.0f MB written (%.0f MB cancelled), final video %.0f MB (%s), state on %s", float64(long.DiskWriteBytes)/1e6,
			float64(long.DiskCancelledBytes)/1e6, float64(long.VideoBytes)/1e6, long.VideoFormat, long.StateFS)
		if long.VideoBytes > 0 {
			g2.Value, g2.Result, g2.Met = l.WritesOverVideo, fmt.Sprintf("%.2f×", l.WritesOverVideo), met(l.WritesOverVideo <= goalLongWrites)
		}
	}
	out = append(out, notRun(g), notRun(g2))

	for _, j := range jobs {
		b := j.Budget
		if !b.OK {
			continue
		}
		g := Goal{Measure: fmt.Sprintf("host RAM, %s: all our processes' RSS peak (system used above baseline)", budgetName(b.Budget, b.Seconds)), Goal: "every number in the record"}
		if _, ok := goalOf[b.Budget]; ok {
			g.Goal = fmt.Sprintf("≤ %.0f GiB", goalHostRSSGiB)
			g.Met = met(b.ProcsRSSPeakGiB <= goalHostRSSGiB)
		}
		g.Ours = fmt.Sprintf("%.1f GiB RSS (%.1f anon+shmem, largest worker %.1f), system +%.1f GiB", b.ProcsRSSPeakGiB, b.ProcsPrivatePeakGiB, b.WorkerRSSPeakGiB, b.HostUsedPeakGiB)
		g.Value, g.Result = b.ProcsRSSPeakGiB, fmt.Sprintf("%.1f GiB", b.ProcsRSSPeakGiB)
		var r *fpRow
		switch b.Budget {
		case "keep", "all", "cold":
			r = fp.job("high_vram", 0)
		default:
			if v, err := strconv.ParseFloat(b.Budget, 64); err == nil {
				r = fp.job("low_vram", v)
			}
		}
		if r != nil {
			g.FramePack = fmt.Sprintf("%s: %.1f GiB RSS, system +%.1f GiB", r.Mode, r.HostRSSPeakGiB, r.HostUsedPeakGiB)
		}
		out = append(out, g)
	}
	return out
}

// notRun fills a goal whose measure is missing.
func notRun(g Goal) Goal {
	if g.Ours == "" {
		g.Ours = "not run"
	}
	if g.Result == "" {
		g.Result = "–"
	}
	return g
}

func goalsTable(gs []Goal) string {
	var b strings.Builder
	b.WriteString("| measure | ours | FramePack | result | goal | met |\n|---|---|---|---|---|---|\n")
	for _, g := range gs {
		m := "–"
		if g.Met != nil {
			m = map[bool]string{true: "yes", false: "**no**"}[*g.Met]
		}
		fp := g.FramePack
		if fp == "" {
			fp = "–"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", g.Measure, g.Ours, fp, g.Result, g.Goal, m)
	}
	return b.String()
}

// sectionMeans are the means over some sections of a job.
type sectionMeans struct {
	N           int     `json:"n"`
	WallS       float64 `json:"wall_s"`
	ComputeS    float64 `json:"compute_s"`
	WriteS      float64 `json:"write_video_s"`
	DiskWriteMB float64 `json:"disk_write_mb"`
}

// longSummary is what the long job shows: its time against its sections' and its disk writes
// against its final files, and whether a section costs more at the end than at the start.
type longSummary struct {
	TotalOverCompute float64 `json:"total_over_sections_compute"`
	TotalOverWall    float64 `json:"total_over_sections_wall"`
	WritesOverVideo  float64 `json:"disk_writes_over_video"`
	// First are the sections after the first (whose stages also spawn and load), Last as many
	// at the end.
	First sectionMeans `json:"first_sections"`
	Last  sectionMeans `json:"last_sections"`
}

func summarizeLong(j Budget) longSummary {
	var l longSummary
	if j.SectionsComputeS > 0 {
		l.TotalOverCompute = j.TotalS / j.SectionsComputeS
	}
	if j.SectionsWallS > 0 {
		l.TotalOverWall = j.TotalS / j.SectionsWallS
	}
	if j.VideoBytes > 0 {
		l.WritesOverVideo = float64(j.DiskWriteBytes) / float64(j.VideoBytes)
	}
	n := min(5, (len(j.Sections)-1)/2)
	if n <= 0 {
		return l
	}
	l.First = means(j.Sections[1 : 1+n])
	l.Last = means(j.Sections[len(j.Sections)-n:])
	return l
}

func means(ss []Section) sectionMeans {
	m := sectionMeans{N: len(ss)}
	for _, s := range ss {
		m.WallS += s.WallS
		m.ComputeS += s.ComputeS
		m.WriteS += s.WriteS
		m.DiskWriteMB += float64(s.DiskWriteBytes) / 1e6
	}
	k := float64(len(ss))
	m.WallS, m.ComputeS, m.WriteS, m.DiskWriteMB = m.WallS/k, m.ComputeS/k, m.WriteS/k, m.DiskWriteMB/k
	return m
}
