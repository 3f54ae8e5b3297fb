package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	goal := func(prefix string) Goal {
		for _, g := range r.Goals {
			if strings.HasPrefix(g.Measure, prefix) {
				return g
			}
		}
		t.Fatalf("no goal %q in %+v", prefix, r.Goals)
		return Goal{}
	}
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
