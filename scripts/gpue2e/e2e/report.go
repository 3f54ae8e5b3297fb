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

// JobTotal is one budget's job in the report.
type JobTotal struct {
	Budget   string  `json:"budget"`
	BudgetGB float64 `json:"budget_gb"`
	CapGiB   float64 `json:"cap_gib"`
	TotalS   float64 `json:"total_s"`
	// FirstJobS is the job its daemon ran before the measured one (-twice), 0 if none.
	FirstJobS    float64 `json:"first_job_s,omitempty"`
	VsAll        float64 `json:"vs_all_resident,omitempty"`
	LoadS        float64 `json:"load_s"`
	LoadShare    float64 `json:"load_share"`
	TransformS   float64 `json:"transformer_s"`
	Resident     uint32  `json:"transformer_resident_blocks"`
	Streamed     uint32  `json:"transformer_streamed_blocks"`
	OutputSHA256 string  `json:"output_sha256,omitempty"`
	// SameAsAll: the output is the all-resident job's, bit for bit (nil: either has no hash).
	SameAsAll     *bool  `json:"same_output_as_all,omitempty"`
	LatentsSHA256 string `json:"latents_sha256,omitempty"`
	// SameLatentsAsAll: the latents alone are the all-resident job's, bit for bit.
	SameLatentsAsAll *bool   `json:"same_latents_as_all,omitempty"`
	MaxPeakGiB       float64 `json:"max_peak_gib"`
	NVMLPeakGiB      float64 `json:"nvml_peak_gib,omitempty"`
	AllUnderCap      bool    `json:"all_under_cap"`
	OK               bool    `json:"ok"`
	Error            string  `json:"error,omitempty"`
	Note             string  `json:"note,omitempty"`
}

// Report is docs/bench/<date>-<gpu>-e2e.json.
type Report struct {
	Date      string          `json:"date"`
	GPU       string          `json:"gpu"`
	Params    string          `json:"params"`
	Rows      []Row           `json:"rows"`
	Jobs      []JobTotal      `json:"jobs"`
	FramePack json.RawMessage `json:"framepack,omitempty"`
}

// report merges OUT's budget files (in -budgets order) and FramePack's results.
func report(o options) error {
	rep := Report{Date: time.Now().UTC().Format("2006-01-02"), GPU: o.gpu}
	var all float64
	var problems []string
	for _, b := range strings.Split(o.budgets, ",") {
		b = strings.TrimSpace(b)
		raw, err := os.ReadFile(filepath.Join(o.out, "budget-"+b+".json"))
		if err != nil {
			continue
		}
		var r Budget
		if err := json.Unmarshal(raw, &r); err != nil {
			return fmt.Errorf("budget %s: %w", b, err)
		}
		rep.Params = r.Params
		rep.Rows = append(rep.Rows, r.Rows...)
		jt := JobTotal{Budget: b, BudgetGB: r.BudgetGB, CapGiB: r.CapGiB, TotalS: r.TotalS, LoadS: r.LoadS, LoadShare: r.LoadShare,
			MaxPeakGiB: r.MaxPeakGiB, NVMLPeakGiB: r.NVMLPeakGiB, AllUnderCap: r.AllUnderCap, OK: r.OK, Error: r.Error, Note: r.Note, FirstJobS: r.FirstJobS, OutputSHA256: r.OutputSHA256,
			LatentsSHA256: r.LatentsSHA256}
		for _, row := range r.Rows {
			if row.Worker == "transformer" {
				jt.TransformS += row.Seconds
				if !row.Reused {
					jt.Resident, jt.Streamed = row.ResidentBlocks, row.StreamedBlocks
				}
			}
			if row.Error != "" {
				problems = append(problems, fmt.Sprintf("budget %s stage %s: %s", b, row.Stage, row.Error))
			}
			if row.Worker != "" && !row.Reused && (row.LoadS <= 0 || row.LoadGBps <= 0 || row.SpawnToReadyS <= 0 || row.PeakGiB <= 0 || row.CapGiB <= 0) {
				problems = append(problems, fmt.Sprintf("budget %s stage %s: incomplete row %+v", b, row.Stage, row))
			}
			if !row.UnderCap {
				problems = append(problems, fmt.Sprintf("budget %s stage %s: peak %.3f GiB over the cap %.3f GiB", b, row.Stage, row.PeakGiB, row.CapGiB))
			}
		}
		if b == "all" {
			all = r.TotalS
		}
		if !r.OK {
			problems = append(problems, fmt.Sprintf("budget %s: job failed: %s", b, r.Error))
		}
		rep.Jobs = append(rep.Jobs, jt)
	}
	allHash, allLatents := "", ""
	for _, j := range rep.Jobs {
		if j.Budget == "all" {
			allHash, allLatents = j.OutputSHA256, j.LatentsSHA256
		}
	}
	sameAs := func(h, ref string) *bool {
		if h == "" || ref == "" {
			return nil
		}
		same := h == ref
		return &same
	}
	for i := range rep.Jobs {
		if all > 0 {
			rep.Jobs[i].VsAll = rep.Jobs[i].TotalS / all
		}
		rep.Jobs[i].SameAsAll = sameAs(rep.Jobs[i].OutputSHA256, allHash)
		rep.Jobs[i].SameLatentsAsAll = sameAs(rep.Jobs[i].LatentsSHA256, allLatents)
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

// fpResults is what framepack_e2e.py writes.
type fpResults struct {
	Rows []struct {
		Mode        string  `json:"mode"`
		BudgetGB    float64 `json:"budget_gb"`
		Stage       string  `json:"stage"`
		Seconds     float64 `json:"seconds"`
		PeakGiB     float64 `json:"peak_gib"`
		NVMLPeakGiB float64 `json:"nvml_peak_gib"`
		LoadS       float64 `json:"load_s"`
		Error       string  `json:"error"`
	} `json:"rows"`
}

// table is the README's performance table: one line per budget, FramePack's rows after.
func table(rep Report, fp fpResults) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nEnd to end (%s; %s; %s)\n\n", rep.GPU, rep.Params, rep.Date)
	b.WriteString("| budget | cap GiB | job s | vs all-resident | load share | transformer s | blocks resident/streamed | max peak GiB | NVML peak GiB | output = all resident | latents = all resident | ok |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, j := range rep.Jobs {
		name := j.Budget + " GB"
		switch j.Budget {
		case "all":
			name = "all resident"
		case "cold":
			name = "all resident, first job (no conv caches)"
		}
		job := fmt.Sprintf("%.1f", j.TotalS)
		if j.FirstJobS > 0 {
			job += fmt.Sprintf(" (first job %.1f)", j.FirstJobS)
		}
		word := func(p *bool) string {
			if p == nil {
				return "–"
			}
			return map[bool]string{true: "same", false: "differs"}[*p]
		}
		same, sameLat := word(j.SameAsAll), word(j.SameLatentsAsAll)
		fmt.Fprintf(&b, "| %s | %.2f | %s | %.2f× | %.1f %% | %.1f | %d/%d | %.2f | %.2f | %s | %s | %v |\n", name, j.CapGiB, job, j.VsAll,
			100*j.LoadShare, j.TransformS, j.Resident, j.Streamed, j.MaxPeakGiB, j.NVMLPeakGiB, same, sameLat, j.OK)
	}
	if len(fp.Rows) > 0 {
		b.WriteString("\nFramePack (demo_gradio.py's worker loop, same checkpoints, same run)\n\n")
		b.WriteString("| mode | budget GB | stage | s | peak GiB (torch) | NVML peak GiB |\n|---|---|---|---|---|---|\n")
		for _, r := range fp.Rows {
			s := fmt.Sprintf("%.2f", r.Seconds)
			if r.Error != "" {
				s = "error: " + r.Error
			}
			fmt.Fprintf(&b, "| %s | %g | %s | %s | %.2f | %.2f |\n", r.Mode, r.BudgetGB, r.Stage, s, r.PeakGiB, r.NVMLPeakGiB)
		}
	}
	b.WriteString("\nPer stage\n\n| budget | stage | section | s | spawn→ready s | load s | load GB/s | compute s | kill→reaped s | kill→memory back s | peak/cap GiB | NVML GiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Rows {
		fmt.Fprintf(&b, "| %s | %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f/%.2f | %.2f |\n", r.Budget, r.Stage, r.Section, r.Seconds,
			r.SpawnToReadyS, r.LoadS, r.LoadGBps, r.ComputeS, r.KillToReapedS, r.KillToMemoryBackS, r.PeakGiB, r.CapGiB, r.NVMLPeakGiB)
	}
	return b.String()
}
