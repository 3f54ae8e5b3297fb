package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// JobTotal is one budget's job in the report: the budget file less its rows, and how it
// compares with the all-resident job.
type JobTotal struct {
	Budget
	// VsAll is the job's time over the (bf16) all-resident job's, fp8 budgets' too.
	VsAll      float64 `json:"vs_all_resident,omitempty"`
	TransformS float64 `json:"transformer_s"`
	Resident   uint32  `json:"transformer_resident_blocks"`
	Streamed   uint32  `json:"transformer_streamed_blocks"`
	// TransformerRSSGiB is the largest host RSS peak of the job's transformer stages.
	TransformerRSSGiB float64 `json:"transformer_rss_peak_gib"`
	// BitReference is the job the outputs are compared with: all, or fp8-all for an fp8 budget
	// (other weights give other latents); empty: none to compare with.
	BitReference string `json:"bit_reference,omitempty"`
	// SameAsAll: the final video's frames are BitReference's, bit for bit (nil: either has no
	// hash, or the jobs differ in length or steps, or no reference ran).
	SameAsAll *bool `json:"same_output_as_all,omitempty"`
	// SameLatentsAsAll: the last section's latents are BitReference's, bit for bit.
	SameLatentsAsAll *bool `json:"same_latents_as_all,omitempty"`
}

// Report is docs/bench/<date>-<gpu>-e2e.json.
type Report struct {
	Date   string `json:"date"`
	GPU    string `json:"gpu"`
	Params string `json:"params"`
	// Goals is issue 30's table: each measure, ours and FramePack's, and whether it is met.
	Goals []Goal `json:"goals"`
	// Long sums the long job (time and disk writes against its length).
	Long      *longSummary    `json:"long,omitempty"`
	Jobs      []JobTotal      `json:"jobs"`
	Rows      []Row           `json:"rows"`
	FramePack json.RawMessage `json:"framepack,omitempty"`
}

// report merges OUT's budget files (in -budgets order) and FramePack's results.
func report(o options) error {
	rep := Report{Date: time.Now().UTC().Format("2006-01-02"), GPU: o.gpu}
	var problems []string
	seen := map[string]bool{}
	for _, b := range splitList(o.budgets) {
		if seen[b] {
			continue
		}
		seen[b] = true
		raw, err := os.ReadFile(filepath.Join(o.out, "budget-"+b+".json"))
		if err != nil {
			continue
		}
		var r Budget
		if err := json.Unmarshal(raw, &r); err != nil {
			return fmt.Errorf("budget %s: %w", b, err)
		}
		if b != "long" || rep.Params == "" {
			rep.Params = r.Params
		}
		rep.Rows = append(rep.Rows, r.Rows...)
		problems = append(problems, r.problems()...)
		jt := JobTotal{Budget: r}
		jt.Rows = nil
		for _, row := range r.Rows {
			if row.Worker == "transformer" {
				jt.TransformS += row.Seconds
				jt.TransformerRSSGiB = max(jt.TransformerRSSGiB, row.RSSPeakGiB)
				if !row.Reused {
					jt.Resident, jt.Streamed = row.ResidentBlocks, row.StreamedBlocks
				}
			}
		}
		rep.Jobs = append(rep.Jobs, jt)
	}
	var all, fp8All *JobTotal
	for i := range rep.Jobs {
		switch rep.Jobs[i].Budget.Budget {
		case "all":
			all = &rep.Jobs[i]
		case fp8Prefix + "all":
			fp8All = &rep.Jobs[i]
		}
	}
	sameAs := func(h, ref string) *bool {
		if h == "" || ref == "" {
			return nil
		}
		same := h == ref
		return &same
	}
	alike := func(j, ref *JobTotal) bool { return ref != nil && j.Seconds == ref.Seconds && j.Steps == ref.Steps }
	for i := range rep.Jobs {
		j := &rep.Jobs[i]
		if alike(j, all) && all.TotalS > 0 {
			j.VsAll = j.TotalS / all.TotalS
		}
		ref := all
		if _, fp8 := baseBudget(j.Budget.Budget); fp8 {
			ref = fp8All
		}
		if !alike(j, ref) {
			continue
		}
		j.BitReference = ref.Budget.Budget
		j.SameAsAll = sameAs(j.OutputSHA256, ref.OutputSHA256)
		j.SameLatentsAsAll = sameAs(j.LatentsSHA256, ref.LatentsSHA256)
	}
	var fp fpResults
	if o.framepack != "" {
		raw, err := os.ReadFile(o.framepack)
		if err != nil {
			return fmt.Errorf("framepack results: %w", err)
		}
		if err := json.Unmarshal(raw, &fp); err != nil {
			return fmt.Errorf("framepack results %s: %w", o.framepack, err)
		}
		rep.FramePack = raw
	}
	rep.Goals = goals(rep.Jobs, fp)
	for _, j := range rep.Jobs {
		if j.Budget.Budget == "long" && j.OK {
			l := summarizeLong(j.Budget)
			rep.Long = &l
		}
	}
	out, err := json.MarshalIndent(rep, "", " ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(o.report), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(o.report, append(out, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Print(table(rep, fp))
	if len(rep.Jobs) < o.minBudgets {
		problems = append(problems, fmt.Sprintf("%d budgets complete, %d required", len(rep.Jobs), o.minBudgets))
	}
	if o.minBudgets > 0 && len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// problems lists what makes a budget's record unusable: failed stages, incomplete worker rows,
// peaks over their caps, a failed job, and a keep job that reused no kept worker.
func (r *Budget) problems() []string {
	var out []string
	b := r.Budget
	for _, row := range r.Rows {
		if row.Error != "" {
			out = append(out, fmt.Sprintf("budget %s stage %s: %s", b, row.Stage, row.Error))
		}
		if row.Worker != "" && !row.Reused && (row.LoadS <= 0 || row.LoadGBps <= 0 || row.SpawnToReadyS <= 0 || row.PeakGiB <= 0 || row.CapGiB <= 0) {
			out = append(out, fmt.Sprintf("budget %s stage %s: incomplete row %+v", b, row.Stage, row))
		}
		if !row.UnderCap {
			out = append(out, fmt.Sprintf("budget %s stage %s: peak %.3f GiB over the cap %.3f GiB", b, row.Stage, row.PeakGiB, row.CapGiB))
		}
	}
	if !r.OK {
		out = append(out, fmt.Sprintf("budget %s: job failed: %s", b, r.Error))
	}
	if base, _ := baseBudget(b); base == "keep" && r.OK && r.ReusedStages < r.WorkerStages {
		out = append(out, fmt.Sprintf("budget %s: the second job reused a kept worker in %d of %d worker stages", b, r.ReusedStages, r.WorkerStages))
	}
	return out
}

// fpRow is one row of framepack_e2e.py's results.
type fpRow struct {
	Mode        string  `json:"mode"`
	BudgetGB    float64 `json:"budget_gb"`
	Stage       string  `json:"stage"`
	Seconds     float64 `json:"seconds"`
	PeakGiB     float64 `json:"peak_gib"`
	NVMLPeakGiB float64 `json:"nvml_peak_gib"`
	LoadS       float64 `json:"load_s"`
	// HostRSSPeakGiB is the FramePack process's RSS peak, HostUsedPeakGiB the system's used
	// memory above its reading when the process started (on the job row: over the whole run,
	// the model load included).
	HostRSSPeakGiB  float64 `json:"host_rss_peak_gib"`
	HostUsedPeakGiB float64 `json:"host_used_peak_gib"`
	// WroteVideo (job rows) says whether the job wrote its video as demo_gradio.py does (an MP4
	// of the whole video so far after every section; framepack_e2e.py --write-video).
	WroteVideo bool `json:"wrote_video"`
	// Beside is what ran beside the run on the machine (the native build, when FramePack's
	// runs go while it compiles).
	Beside string `json:"beside"`
	Error  string `json:"error"`
}

// fpResults is what framepack_e2e.py writes.
type fpResults struct {
	Rows []fpRow `json:"rows"`
}

// job is the job row of FramePack's run in mode at budget (nil: none without error).
func (f fpResults) job(mode string, budget float64) *fpRow {
	for i := len(f.Rows) - 1; i >= 0; i-- {
		r := &f.Rows[i]
		if r.Mode == mode && r.BudgetGB == budget && r.Stage == "job" && r.Error == "" {
			return r
		}
	}
	return nil
}

// table is the README's tables: the goals, one line per budget, the long job, FramePack's rows,
// every stage.
func table(rep Report, fp fpResults) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nEnd to end (%s; %s; %s)\n\n", rep.GPU, rep.Params, rep.Date)
	b.WriteString(goalsTable(rep.Goals))
	b.WriteString("\n| budget | lane GiB | job s | without video s | vs all-resident | load share | reused/worker stages | transformer s | blocks resident/streamed | max peak GiB | NVML peak GiB | host used GiB | our RSS GiB (anon+shmem) | max worker RSS GiB | disk writes MB | video MB | output = all (fp8: fp8-all) | latents = all (fp8: fp8-all) | ok |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, j := range rep.Jobs {
		job := fmt.Sprintf("%.1f", j.TotalS)
		if j.FirstJobS > 0 {
			job += fmt.Sprintf(" (first job %.1f)", j.FirstJobS)
		}
		vs := "–"
		if j.VsAll > 0 {
			vs = fmt.Sprintf("%.2f×", j.VsAll)
		}
		fmt.Fprintf(&b, "| %s | %.2f | %s | %.1f | %s | %.1f %% | %d/%d | %.1f | %d/%d | %.2f | %.2f | %.1f | %.1f (%.1f) | %.1f | %.0f | %.0f | %s | %s | %v |\n",
			j.label(), j.CapGiB, job, j.TotalNoVideoS, vs, 100*j.LoadShare, j.ReusedStages, j.WorkerStages, j.TransformS,
			j.Resident, j.Streamed, j.MaxPeakGiB, j.NVMLPeakGiB, j.HostUsedPeakGiB, j.ProcsRSSPeakGiB, j.ProcsPrivatePeakGiB, j.WorkerRSSPeakGiB,
			float64(j.DiskWriteBytes)/1e6, float64(j.VideoBytes)/1e6, word(j.SameAsAll), word(j.SameLatentsAsAll), j.OK)
	}
	for _, j := range rep.Jobs {
		if j.Budget.Budget == "long" {
			b.WriteString(longTable(j.Budget))
		}
	}
	if len(fp.Rows) > 0 {
		b.WriteString("\nFramePack (demo_gradio.py's worker loop, same checkpoints, same run; job rows: the models already in host memory)\n\n")
		b.WriteString("| mode | budget GB | stage | s | peak GiB (torch) | NVML peak GiB | RSS peak GiB | host used GiB | video written |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range fp.Rows {
			s := fmt.Sprintf("%.2f", r.Seconds)
			if r.Error != "" {
				s = "error: " + r.Error
			}
			v := "–"
			if r.Stage == "job" {
				v = fmt.Sprint(r.WroteVideo)
				if r.Beside != "" {
					s += " (" + r.Beside + ")"
				}
			}
			fmt.Fprintf(&b, "| %s | %g | %s | %s | %.2f | %.2f | %.1f | %.1f | %s |\n", r.Mode, r.BudgetGB, r.Stage, s, r.PeakGiB, r.NVMLPeakGiB, r.HostRSSPeakGiB, r.HostUsedPeakGiB, v)
		}
	}
	b.WriteString("\nPer stage\n\n| budget | stage | section | s | spawn→ready s | load s | load GB/s | compute s | kill→reaped s | kill→memory back s | peak/cap GiB | stage cap GiB | reused/kept | RSS GiB | NVML GiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Rows {
		if r.Budget == "long" && r.Section > 2 {
			continue // the long job's sections are summed in its own table
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f/%.2f | %.2f | %s | %.2f | %.2f |\n", r.Budget, r.Stage, r.Section, r.Seconds,
			r.SpawnToReadyS, r.LoadS, r.LoadGBps, r.ComputeS, r.KillToReapedS, r.KillToMemoryBackS, r.PeakGiB, r.CapGiB, r.StageCapGiB,
			flags(r.Reused, r.Kept), r.RSSPeakGiB, r.NVMLPeakGiB)
	}
	return b.String()
}

// label names a budget in the tables: "16 GB", "all resident", "16 GB, fp8 weights (token)".
func (r *Budget) label() string {
	base, fp8 := baseBudget(r.Budget)
	name := base + " GB"
	switch base {
	case "all":
		name = "all resident"
	case "keep":
		name = "all resident, keep-alive (second job)"
	case "cold":
		name = "all resident, first job (no conv caches)"
	case "long":
		name = fmt.Sprintf("long (%g s)", r.Seconds)
	}
	if fp8 {
		name += ", " + r.fp8Words()
	}
	return name
}

// fp8Words is an fp8 budget's weights in words: "fp8 weights (token)", with the compute mode
// the job's settings report (else the one it asked for).
func (r *Budget) fp8Words() string {
	c := r.ServedFP8Compute
	if c == "" {
		c = r.FP8Compute
	}
	return fmt.Sprintf("fp8 weights (%s)", c)
}

// weightsNote is the progress line's word on an fp8 budget's weights (empty for bf16).
func (r *Budget) weightsNote() string {
	if r.Weights == "" {
		return ""
	}
	return fmt.Sprintf("weights %s (format %s, compute %s asked, %s reported), ", r.Weights, r.WeightsFormat, r.FP8Compute, r.ServedFP8Compute)
}

func word(p *bool) string {
	if p == nil {
		return "–"
	}
	return map[bool]string{true: "same", false: "differs"}[*p]
}

func flags(reused, kept bool) string {
	return map[bool]string{true: "r", false: "–"}[reused] + "/" + map[bool]string{true: "k", false: "–"}[kept]
}

// longTable sums the long job: time and disk writes per section at its start and its end.
func longTable(j Budget) string {
	var b strings.Builder
	l := summarizeLong(j)
	fmt.Fprintf(&b, "\nLong job (%g s, %d sections, %d steps, %.0f GiB lane): total %.1f s, sections' compute %.1f s (wall %.1f s), once-per-job stages %.1f s, outside stages %.1f s; disk writes %.0f MB (cancelled %.0f MB) for a final video of %.0f MB (%s, job folder %.0f MB, state on %s)\n\n",
		j.Seconds, len(j.Sections), j.Steps, j.CapGiB, j.TotalS, j.SectionsComputeS, j.SectionsWallS, j.OnceS, j.GapS,
		float64(j.DiskWriteBytes)/1e6, float64(j.DiskCancelledBytes)/1e6, float64(j.VideoBytes)/1e6, j.VideoFormat, float64(j.JobDirBytes)/1e6, j.StateFS)
	b.WriteString("| sections | mean wall s | mean compute s | mean write-video s | mean disk writes MB |\n|---|---|---|---|---|\n")
	for _, g := range []struct {
		name string
		s    sectionMeans
	}{{"first " + fmt.Sprint(l.First.N), l.First}, {"last " + fmt.Sprint(l.Last.N), l.Last}} {
		fmt.Fprintf(&b, "| %s | %.2f | %.2f | %.2f | %.1f |\n", g.name, g.s.WallS, g.s.ComputeS, g.s.WriteS, g.s.DiskWriteMB)
	}
	return b.String()
}
