package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The goals table from budget files and FramePack's results: times set side by side without
// our video-writing stages (FramePack wrote none), speedups against the low-VRAM runs at the
// same memory, the 16 GB job's load share, the long job's ratios, host RAM per budget.
func TestReportGoals(t *testing.T) {
	out := t.TempDir()
	sections := []Section{{Index: 0, WallS: 20, ComputeS: 14}, {Index: 1, WallS: 10, ComputeS: 9, DiskWriteBytes: 40e6},
		{Index: 2, WallS: 10, ComputeS: 9, DiskWriteBytes: 40e6}, {Index: 3, WallS: 11, ComputeS: 10, DiskWriteBytes: 42e6},
		{Index: 4, WallS: 11, ComputeS: 10, DiskWriteBytes: 42e6}}
	budgets := []Budget{
		{Budget: "keep", OK: true, Seconds: 4, Steps: 5, TotalS: 55, TotalNoVideoS: 50, WorkerStages: 9, ReusedStages: 9, ProcsRSSPeakGiB: 40},
		{Budget: "all", OK: true, Seconds: 4, Steps: 5, TotalS: 70, TotalNoVideoS: 65, OutputSHA256: "a", LatentsSHA256: "l"},
		{Budget: "16", OK: true, Seconds: 4, Steps: 5, TotalS: 45, TotalNoVideoS: 40, LoadS: 2.25, LoadShare: 0.05, ProcsRSSPeakGiB: 20, OutputSHA256: "a", LatentsSHA256: "l"},
		{Budget: "6", OK: true, Seconds: 4, Steps: 5, TotalS: 55, TotalNoVideoS: 50, ProcsRSSPeakGiB: 33, OutputSHA256: "b", LatentsSHA256: "l"},
		{Budget: "long", OK: true, Seconds: 60, Steps: 5, CapGiB: 16, TotalS: 63, SectionsComputeS: 52, SectionsWallS: 62,
			DiskWriteBytes: 300e6, VideoBytes: 100e6, Sections: sections, OutputSHA256: "c"},
	}
	for _, b := range budgets {
		raw, _ := json.Marshal(b)
		if err := os.WriteFile(filepath.Join(out, "budget-"+b.Budget+".json"), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fp := `{"rows": [
	 {"mode": "high_vram", "budget_gb": 0, "stage": "job", "seconds": 60, "load_s": 9, "host_rss_peak_gib": 45, "host_used_peak_gib": 50},
	 {"mode": "low_vram", "budget_gb": 16, "stage": "job", "seconds": 120, "load_s": 9},
	 {"mode": "low_vram", "budget_gb": 6, "stage": "job", "seconds": 0, "error": "OOM"}]}`
	fpPath := filepath.Join(out, "framepack.json")
	if err := os.WriteFile(fpPath, []byte(fp), 0o644); err != nil {
		t.Fatal(err)
	}
	rep := filepath.Join(out, "r.json")
	if err := report(options{out: out, budgets: "keep,all,16,6,long", report: rep, framepack: fpPath}); err != nil {
		t.Fatal(err)
	}
	var r Report
	raw, _ := os.ReadFile(rep)
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	goal := func(prefix string) Goal { return findGoal(t, r, prefix) }
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	isMet := func(g Goal, want bool) bool { return g.Met != nil && *g.Met == want }
	if g := goal("4 s job where everything fits"); !near(g.Value, 50.0/60) || !isMet(g, true) {
		t.Errorf("keep vs high-VRAM: %+v", g)
	}
	if g := goal("4 s job at 16 GB"); !near(g.Value, 3) || !isMet(g, true) || !strings.Contains(g.Ours, "40.0 s without video (45.0 s with)") {
		t.Errorf("16 GB vs low-VRAM 16: %+v", g)
	}
	if g := goal("4 s job at 6 GB"); g.Met != nil || g.FramePack != "" || g.Ours == "not run" {
		t.Errorf("6 GB against a FramePack run that failed: %+v", g)
	}
	if g := goal("load share"); !near(g.Value, 0.05) || !isMet(g, true) {
		t.Errorf("load share: %+v", g)
	}
	if g := goal("60 s job at 16 GB (5 sections, 5 steps): total"); !near(g.Value, 63.0/52) || !isMet(g, false) {
		t.Errorf("long time: %+v", g)
	}
	if g := goal("60 s job at 16 GB (5 sections, 5 steps): bytes"); !near(g.Value, 3) || !isMet(g, true) {
		t.Errorf("long writes: %+v", g)
	}
	if g := goal("host RAM, 6 GB"); !isMet(g, false) || g.Value != 33 {
		t.Errorf("host RAM at 6 GB: %+v", g)
	}
	if g := goal("host RAM, all resident, keep-alive"); g.Met != nil || !strings.Contains(g.FramePack, "45.0 GiB RSS") {
		t.Errorf("host RAM of keep (no goal, FramePack's high-VRAM beside it): %+v", g)
	}
	if r.Long == nil || r.Long.First.N != 2 || r.Long.First.WallS != 10 || r.Long.Last.WallS != 11 || r.Long.Last.DiskWriteMB != 42 {
		t.Errorf("long summary %+v", r.Long)
	}
	// bit identity against the all-resident job: 16 GB same, 6 GB differs, long not compared
	for _, j := range r.Jobs {
		switch j.Budget.Budget {
		case "16":
			if j.SameAsAll == nil || !*j.SameAsAll {
				t.Errorf("16: %v", j.SameAsAll)
			}
		case "6":
			if j.SameAsAll == nil || *j.SameAsAll || !*j.SameLatentsAsAll {
				t.Errorf("6: %v %v", j.SameAsAll, j.SameLatentsAsAll)
			}
		case "long":
			if j.SameAsAll != nil || j.VsAll != 0 {
				t.Errorf("long compared with all: %v %v", j.SameAsAll, j.VsAll)
			}
		}
	}
}

// The fp8 budgets in the report: labelled with their compute mode, compared bit for bit with
// the fp8-all job only (none without it: "–", and -require does not fail on fp8 outputs that
// differ from bf16's), their goal rows against FramePack and against our bf16 budget of the
// same memory, fp8-16 against bf16 all-resident, and fp8-keep held to keep's reuse check.
func TestReportFP8(t *testing.T) {
	out := t.TempDir()
	tr := func(b string, rss float64, resident, streamed uint32, reused bool) Row {
		return Row{Budget: b, Stage: "STAGE_TRANSFORMER", Worker: "transformer", Seconds: 10, SpawnToReadyS: 0.1, LoadS: 1, LoadGBps: 10,
			PeakGiB: 1, CapGiB: 2, UnderCap: true, RSSPeakGiB: rss, ResidentBlocks: resident, StreamedBlocks: streamed, Reused: reused}
	}
	fp8 := func(b Budget) Budget {
		b.Weights, b.FP8Compute, b.WeightsFormat, b.ServedFP8Compute = "fp8", "token", "quantized", "token"
		return b
	}
	write := func(bs ...Budget) {
		for _, b := range bs {
			b.Seconds, b.Steps, b.OK = 4, 5, true
			raw, _ := json.Marshal(b)
			if err := os.WriteFile(filepath.Join(out, "budget-"+b.Budget+".json"), raw, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(Budget{Budget: "keep", TotalS: 55, TotalNoVideoS: 50, WorkerStages: 1, ReusedStages: 1, OutputSHA256: "a", LatentsSHA256: "l", Rows: []Row{tr("keep", 30, 0, 0, true)}},
		Budget{Budget: "all", TotalS: 70, TotalNoVideoS: 65, OutputSHA256: "a", LatentsSHA256: "l", Rows: []Row{tr("all", 30, 40, 0, false)}},
		Budget{Budget: "16", TotalS: 45, TotalNoVideoS: 40, ProcsRSSPeakGiB: 36, OutputSHA256: "a", LatentsSHA256: "l", Rows: []Row{tr("16", 35, 20, 20, false)}},
		Budget{Budget: "6", TotalS: 65, TotalNoVideoS: 60, ProcsRSSPeakGiB: 33, OutputSHA256: "b", LatentsSHA256: "l", Rows: []Row{tr("6", 34, 4, 36, false)}},
		fp8(Budget{Budget: "fp8-keep", TotalS: 48, TotalNoVideoS: 45, WorkerStages: 2, ReusedStages: 1, OutputSHA256: "f", LatentsSHA256: "m",
			Rows: []Row{tr("fp8-keep", 15, 0, 0, true), tr("fp8-keep", 15, 40, 0, false)}}),
		fp8(Budget{Budget: "fp8-16", TotalS: 66, TotalNoVideoS: 60, ProcsRSSPeakGiB: 20, OutputSHA256: "f", LatentsSHA256: "m", Rows: []Row{tr("fp8-16", 17.5, 40, 0, false)}}),
		fp8(Budget{Budget: "fp8-6", TotalS: 45, TotalNoVideoS: 40, ProcsRSSPeakGiB: 18, OutputSHA256: "g", LatentsSHA256: "m", Rows: []Row{tr("fp8-6", 17, 8, 32, false)}}))
	fp := `{"rows": [
	 {"mode": "high_vram", "budget_gb": 0, "stage": "job", "seconds": 60, "load_s": 9},
	 {"mode": "low_vram", "budget_gb": 16, "stage": "job", "seconds": 120, "load_s": 9},
	 {"mode": "low_vram", "budget_gb": 6, "stage": "job", "seconds": 200, "load_s": 9}]}`
	fpPath := filepath.Join(out, "framepack.json")
	if err := os.WriteFile(fpPath, []byte(fp), 0o644); err != nil {
		t.Fatal(err)
	}
	rep := filepath.Join(out, "r.json")
	const budgets = "keep,all,16,6,fp8-keep,fp8-all,fp8-16,fp8-6"
	read := func(require int) (Report, error) {
		err := report(options{out: out, budgets: budgets, report: rep, framepack: fpPath, minBudgets: require})
		var r Report
		raw, _ := os.ReadFile(rep)
		if jerr := json.Unmarshal(raw, &r); jerr != nil {
			t.Fatal(jerr)
		}
		return r, err
	}
	// fp8-keep reused 1 of 2 worker stages: the only problem (fp8 outputs differ from bf16's)
	r, err := read(7)
	if err == nil || !strings.Contains(err.Error(), "budget fp8-keep: the second job reused a kept worker in 1 of 2 worker stages") ||
		strings.Count(err.Error(), "\n") != 0 {
		t.Errorf("-require: %v", err)
	}
	jobs := map[string]JobTotal{}
	for _, j := range r.Jobs {
		jobs[j.Budget.Budget] = j
	}
	// without fp8-all the fp8 budgets are compared with nothing; their time is against bf16 all
	for _, b := range []string{"fp8-keep", "fp8-16", "fp8-6"} {
		if j := jobs[b]; j.SameAsAll != nil || j.SameLatentsAsAll != nil || j.BitReference != "" || j.VsAll <= 0 {
			t.Errorf("%s without fp8-all: compared with %q: %v %v, vs all %v", b, j.BitReference, j.SameAsAll, j.SameLatentsAsAll, j.VsAll)
		}
	}
	if j := jobs["16"]; j.BitReference != "all" || j.SameLatentsAsAll == nil || !*j.SameLatentsAsAll || j.TransformerRSSGiB != 35 {
		t.Errorf("16: %+v", j)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	isMet := func(g Goal, want bool) bool { return g.Met != nil && *g.Met == want }
	if g := findGoal(t, r, "4 s job at 6 GB: fp8 weights (token) vs our bf16, time"); !near(g.Value, 1.5) || !isMet(g, true) {
		t.Errorf("fp8-6 vs 6: %+v", g)
	}
	if g := findGoal(t, r, "4 s job at 16 GB: fp8 weights (token) vs our bf16, time"); !near(g.Value, 40.0/60) || g.Met != nil {
		t.Errorf("fp8-16 vs 16 (no goal): %+v", g)
	}
	if g := findGoal(t, r, "host RAM at 16 GB: fp8 weights (token) vs our bf16"); !near(g.Value, 0.5) || !isMet(g, true) || !strings.Contains(g.Result, "all our processes 0.56×") {
		t.Errorf("fp8-16 RSS: %+v", g)
	}
	if g := findGoal(t, r, "4 s job at 16 GB, fp8 weights (token): every block resident"); !near(g.Value, 60.0/65) || !isMet(g, true) {
		t.Errorf("fp8-16 vs all: %+v", g)
	}
	if g := findGoal(t, r, "4 s job at 6 GB, fp8 weights (token) vs FramePack low-VRAM at 6 GB"); !near(g.Value, 5) || g.Met != nil || g.FramePack == "" {
		t.Errorf("fp8-6 vs FramePack low-VRAM: %+v", g)
	}
	if g := findGoal(t, r, "4 s job where everything fits (keep-alive on, warm workers), fp8 weights (token) vs FramePack high-VRAM"); !near(g.Value, 0.75) || g.Met != nil {
		t.Errorf("fp8-keep vs FramePack high-VRAM: %+v", g)
	}
	if g := findGoal(t, r, "4 s job where everything fits (keep-alive on, warm workers): fp8 weights (token) vs our bf16, time"); !near(g.Value, 50.0/45) {
		t.Errorf("fp8-keep vs keep: %+v", g)
	}
	if g := findGoal(t, r, "host RAM, 16 GB, fp8 weights (token)"); g.Met != nil || !strings.Contains(g.FramePack, "low_vram") {
		t.Errorf("host RAM of fp8-16 (FramePack low-VRAM 16 beside it): %+v", g)
	}
	table := table(r, fpResults{})
	for _, want := range []string{"| 16 GB, fp8 weights (token) |", "| all resident, keep-alive (second job), fp8 weights (token) |"} {
		if !strings.Contains(table, want) {
			t.Errorf("table has no %q", want)
		}
	}

	// with fp8-all: the fp8 budgets' outputs are compared with it
	write(fp8(Budget{Budget: "fp8-all", TotalS: 62, TotalNoVideoS: 57, OutputSHA256: "f", LatentsSHA256: "m", Rows: []Row{tr("fp8-all", 16, 40, 0, false)}}))
	r, _ = read(0)
	for _, j := range r.Jobs {
		b := j.Budget.Budget
		if _, isFP8 := baseBudget(b); !isFP8 {
			continue
		}
		if j.BitReference != "fp8-all" || j.SameLatentsAsAll == nil || !*j.SameLatentsAsAll || j.SameAsAll == nil || *j.SameAsAll != (b != "fp8-6") {
			t.Errorf("%s against fp8-all: %q %v %v", b, j.BitReference, j.SameAsAll, j.SameLatentsAsAll)
		}
	}
}

// The fp8 budgets' names: fp8- before keep, all, cold or a number; never before long.
func TestSpecFP8(t *testing.T) {
	o := options{fp8Compute: "tensor", twice: map[string]bool{}, keepAlive: time.Minute, longGB: 16}
	for b, want := range map[string]budgetSpec{
		"fp8-keep": {twice: true, keepAlive: time.Minute, weights: "fp8", fp8Compute: "tensor"},
		"fp8-all":  {weights: "fp8", fp8Compute: "tensor"},
		"fp8-6":    {laneGB: 6, weights: "fp8", fp8Compute: "tensor"},
		"6":        {laneGB: 6},
	} {
		s, err := o.spec(b)
		if err != nil || s != want {
			t.Errorf("%s: %+v, %v; want %+v", b, s, err, want)
		}
	}
	for _, b := range []string{"fp8-long", "fp8-", "fp8-x", "fp8"} {
		if _, err := o.spec(b); err == nil {
			t.Errorf("%s: no error", b)
		}
	}
}

// findGoal is the report's goal whose measure begins with prefix.
func findGoal(t *testing.T, r Report, prefix string) Goal {
	t.Helper()
	for _, g := range r.Goals {
		if strings.HasPrefix(g.Measure, prefix) {
			return g
		}
	}
	t.Fatalf("no goal %q in %+v", prefix, r.Goals)
	return Goal{}
}
