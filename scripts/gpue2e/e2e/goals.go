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
	var out []Goal

	g := Goal{Measure: job + " where everything fits (keep-alive on, warm workers) vs FramePack high-VRAM", Goal: fmt.Sprintf("≤ %.1f× FramePack's time", goalKeepVsHighFP)}
	out = append(out, againstFP(g, byName["keep"], fp.job("high_vram", 0), false, func(v float64) bool { return v <= goalKeepVsHighFP }))

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
		var check func(float64) bool
		if hasGoal {
			g.Goal = fmt.Sprintf("≥ %.1f× faster", want)
			check = func(v float64) bool { return v >= want }
		}
		out = append(out, againstFP(g, byName[b], fp.job("low_vram", v), true, check))
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
		g := Goal{Measure: fmt.Sprintf("host RAM, %s: all our processes' RSS peak (system used above baseline)", b.label()), Goal: "every number in the record"}
		if _, ok := goalOf[b.Budget]; ok {
			g.Goal = fmt.Sprintf("≤ %.0f GiB", goalHostRSSGiB)
			g.Met = met(b.ProcsRSSPeakGiB <= goalHostRSSGiB)
		}
		g.Ours = fmt.Sprintf("%.1f GiB RSS (%.1f anon+shmem, largest worker %.1f), system +%.1f GiB", b.ProcsRSSPeakGiB, b.ProcsPrivatePeakGiB, b.WorkerRSSPeakGiB, b.HostUsedPeakGiB)
		g.Value, g.Result = b.ProcsRSSPeakGiB, fmt.Sprintf("%.1f GiB", b.ProcsRSSPeakGiB)
		if r := fp.sameMemory(b.Budget); r != nil {
			g.FramePack = fmt.Sprintf("%s: %.1f GiB RSS, system +%.1f GiB", r.Mode, r.HostRSSPeakGiB, r.HostUsedPeakGiB)
		}
		out = append(out, g)
	}
	return append(out, fp8Goals(jobs, fp, job)...)
}

// ourTime is b's time to set beside FramePack's job r: with our video writing where r wrote its
// video, else without.
func ourTime(b *Budget, r *fpRow) (float64, string) {
	if r != nil && r.WroteVideo {
		return b.TotalS, fmt.Sprintf("%.1f s with video (%.1f s without)", b.TotalS, b.TotalNoVideoS)
	}
	return b.TotalNoVideoS, fmt.Sprintf("%.1f s without video (%.1f s with)", b.TotalNoVideoS, b.TotalS)
}

// fpTime is FramePack's job r in words.
func fpTime(r *fpRow) string {
	v := "without video"
	if r.WroteVideo {
		v = "with video"
	}
	if r.Beside != "" {
		v += "; " + r.Beside
	}
	return fmt.Sprintf("%.1f s %s (+ %.1f s load)", r.Seconds, v, r.LoadS)
}

// againstFP fills g with our job set beside FramePack's job r (nil: none that finished): our
// time over its (speedup false: against high-VRAM) or its time over ours (speedup true: against
// low-VRAM); check says whether the value meets the goal (nil: the row has none).
func againstFP(g Goal, ours *Budget, r *fpRow, speedup bool, check func(float64) bool) Goal {
	if ours == nil || !ours.OK {
		return notRun(g)
	}
	t, s := ourTime(ours, r)
	g.Ours = s
	if r != nil && r.Seconds > 0 && t > 0 {
		g.FramePack = fpTime(r)
		if speedup {
			g.Value, g.Result = r.Seconds/t, fmt.Sprintf("%.2f× faster", r.Seconds/t)
		} else {
			g.Value, g.Result = t/r.Seconds, fmt.Sprintf("%.2f× FramePack's time", t/r.Seconds)
		}
		if check != nil {
			g.Met = met(check(g.Value))
		}
	}
	return notRun(g)
}

// sameMemory is FramePack's job at budget b's memory: high-VRAM beside keep, all and cold,
// low-VRAM at N GB beside N (fp8 budgets as the budget they behave as).
func (f fpResults) sameMemory(b string) *fpRow {
	base, _ := baseBudget(b)
	switch base {
	case "keep", "all", "cold":
		return f.job("high_vram", 0)
	}
	if v, err := strconv.ParseFloat(base, 64); err == nil {
		return f.job("low_vram", v)
	}
	return nil
}

// Issue 31's goals for the fp8 budgets (against our bf16 budget of the same memory).
const (
	goalFP8SpeedupAt6 = 1.3  // fp8-6 at least this much faster than 6
	goalFP8RSSAt16    = 0.55 // fp8-16's transformer worker RSS at most this share of 16's
	goalFP8At16VsAll  = 1.0  // fp8-16's time at most this share of all's, every block resident
)

// fp8Goals are the rows of the fp8 budgets (fp8-keep, fp8-N, …): each against FramePack at the
// same memory (fp8-keep: high-VRAM; fp8-N: low-VRAM at N GB; no goal), against our bf16 budget
// of the same memory (time without video, and the transformer worker's host RSS peak: fp8
// weights halve its host copy; issue 31 wants fp8-6 ≥ 1.3× faster than 6 and fp8-16's
// transformer RSS ≤ 0.55× of 16's), and fp8-16 against our bf16 all-resident job (every block
// resident and no slower). With any fp8 budget in the report, the rows with a goal appear as
// "not run" where their budget did not run; with none, no row appears.
func fp8Goals(jobs []JobTotal, fp fpResults, job string) []Goal {
	byName := map[string]*JobTotal{}
	var names []string
	for i := range jobs {
		byName[jobs[i].Budget.Budget] = &jobs[i]
		if _, fp8 := baseBudget(jobs[i].Budget.Budget); fp8 {
			names = append(names, jobs[i].Budget.Budget)
		}
	}
	if len(names) == 0 {
		return nil
	}
	for _, b := range []string{fp8Prefix + "16", fp8Prefix + "6"} {
		if byName[b] == nil {
			names = append(names, b)
		}
	}
	where := func(base string) string {
		switch base {
		case "keep":
			return "where everything fits (keep-alive on, warm workers)"
		case "all":
			return "all resident"
		case "cold":
			return "all resident, first job"
		}
		return "at " + base + " GB"
	}
	ok := func(b string) *Budget {
		if j := byName[b]; j != nil && j.OK {
			return &j.Budget
		}
		return nil
	}
	var out []Goal
	for _, name := range names {
		base, _ := baseBudget(name)
		f8, bf := ok(name), ok(base)
		weights := "fp8 weights"
		if f8 != nil {
			weights = f8.fp8Words()
		}
		// against FramePack at the same memory
		switch _, err := strconv.ParseFloat(base, 64); {
		case base == "keep":
			out = append(out, againstFP(Goal{Measure: fmt.Sprintf("%s %s, %s vs FramePack high-VRAM", job, where(base), weights), Goal: "–"},
				f8, fp.job("high_vram", 0), false, nil))
		case err == nil:
			out = append(out, againstFP(Goal{Measure: fmt.Sprintf("%s %s, %s vs FramePack low-VRAM at %s GB", job, where(base), weights, base), Goal: "–"},
				f8, fp.sameMemory(base), true, nil))
		}
		// against our bf16 budget of the same memory: time
		g := Goal{Measure: fmt.Sprintf("%s %s: %s vs our bf16, time without video", job, where(base), weights), Goal: "–"}
		if base == "6" {
			g.Goal = fmt.Sprintf("≥ %.1f× faster", goalFP8SpeedupAt6)
		}
		if f8 != nil {
			g.Ours = fmt.Sprintf("fp8 %.1f s (%.1f s with video)", f8.TotalNoVideoS, f8.TotalS)
			if bf == nil {
				g.Ours += fmt.Sprintf("; bf16 budget %s not run", base)
			} else if f8.TotalNoVideoS > 0 {
				g.Ours += fmt.Sprintf(", bf16 %.1f s (%.1f s with video)", bf.TotalNoVideoS, bf.TotalS)
				g.Value = bf.TotalNoVideoS / f8.TotalNoVideoS
				g.Result = fmt.Sprintf("fp8 %.2f× as fast as bf16", g.Value)
				if base == "6" {
					g.Met = met(g.Value >= goalFP8SpeedupAt6)
				}
			}
		}
		out = append(out, notRun(g))
		// against our bf16 budget of the same memory: host RAM
		g = Goal{Measure: fmt.Sprintf("host RAM %s: %s vs our bf16, transformer worker RSS peak", where(base), weights), Goal: "–"}
		if base == "16" {
			g.Goal = fmt.Sprintf("≤ %.2f× of bf16", goalFP8RSSAt16)
		}
		if f8 != nil {
			j := byName[name]
			g.Ours = fmt.Sprintf("fp8: transformer %.1f GiB, all our processes %.1f GiB, system +%.1f GiB", j.TransformerRSSGiB, f8.ProcsRSSPeakGiB, f8.HostUsedPeakGiB)
			if bf == nil {
				g.Ours += fmt.Sprintf("; bf16 budget %s not run", base)
			} else {
				jb := byName[base]
				g.Ours += fmt.Sprintf("; bf16: transformer %.1f GiB, all our processes %.1f GiB, system +%.1f GiB", jb.TransformerRSSGiB, bf.ProcsRSSPeakGiB, bf.HostUsedPeakGiB)
				if jb.TransformerRSSGiB > 0 {
					g.Value = j.TransformerRSSGiB / jb.TransformerRSSGiB
					g.Result = fmt.Sprintf("%.2f× of bf16", g.Value)
					if bf.ProcsRSSPeakGiB > 0 {
						g.Result += fmt.Sprintf(" (all our processes %.2f×)", f8.ProcsRSSPeakGiB/bf.ProcsRSSPeakGiB)
					}
					if base == "16" {
						g.Met = met(g.Value <= goalFP8RSSAt16)
					}
				}
			}
		}
		out = append(out, notRun(g))
		if base != "16" {
			continue
		}
		// fp8 at 16 GB against our bf16 all-resident job
		g = Goal{Measure: fmt.Sprintf("%s %s, %s: every block resident; vs our bf16 all-resident job", job, where(base), weights),
			Goal: fmt.Sprintf("every block resident; ≤ %.1f× bf16 all-resident's time", goalFP8At16VsAll)}
		if f8 != nil {
			j, all := byName[name], ok("all")
			g.Ours = fmt.Sprintf("%d/%d transformer blocks resident/streamed, %.1f s without video", j.Resident, j.Streamed, f8.TotalNoVideoS)
			if all == nil {
				g.Ours += "; bf16 all-resident not run"
			} else if all.TotalNoVideoS > 0 {
				g.Ours += fmt.Sprintf("; bf16 all-resident %.1f s", all.TotalNoVideoS)
				g.Value = f8.TotalNoVideoS / all.TotalNoVideoS
				g.Result = fmt.Sprintf("%.2f× bf16 all-resident's time, %d blocks streamed", g.Value, j.Streamed)
				g.Met = met(j.Resident > 0 && j.Streamed == 0 && g.Value <= goalFP8At16VsAll)
			}
		}
		out = append(out, notRun(g))
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
