package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/testbin"
)

// TestMain runs the harness itself when E2E_HARNESS is set (the test starts its own binary
// as the harness, so the harness's own flags and exit status are what is tested).
func TestMain(m *testing.M) {
	if os.Getenv("E2E_HARNESS") != "" {
		main()
		os.Exit(0)
	}
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// TestE2ECPU is `make e2e-cpu`: mkmodels re-draws the tiny models in the hub layout (sharded),
// then the harness runs one job through a real framepackd and the CLI on a cpu lane of 2 GiB
// at three budgets (cold: the whole lane with empty conv caches, then the whole lane and a 0.25
// GiB cap, each starting with the caches the jobs before it left; the 0.25 GiB daemon runs a
// first job before the measured one, -twice), and -report -require 3
// checks that every job finished, every worker stage has its spawn, load, GB/s, peak and cap,
// and every peak is under its cap. A second harness run keeps every budget (resumable).
func TestE2ECPU(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the daemon and its workers")
	}
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	for _, p := range []string{"cmd/framepackd", "cmd/framepack", "workers/textenc", "workers/vae", "workers/clipvision", "workers/transformer", "workers/probe", "scripts/gpue2e/mkmodels"} {
		if err := os.Symlink(testbin.Build(t, "./"+p), filepath.Join(bin, filepath.Base(p))); err != nil {
			t.Fatal(err)
		}
	}
	models, out := t.TempDir(), t.TempDir()
	mk := exec.Command(filepath.Join(bin, "mkmodels"), "-fixtures", filepath.Join(root, "testdata", "parity", "models"), "-out", models, "-shard-mb", "2")
	if b, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("mkmodels: %v\n%s", err, b)
	}
	if _, err := os.Stat(filepath.Join(models, "hunyuanvideo-community/HunyuanVideo/text_encoder/model.safetensors.index.json")); err != nil {
		t.Errorf("text encoder not sharded: %v", err)
	}
	harness := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), "E2E_HARNESS=1")
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("e2e %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		return string(b)
	}
	args := []string{"-bin", bin, "-models", models, "-out", out, "-lane", "cpu", "-device-gib", "2", "-budgets", "cold,all,0.25", "-twice", "0.25",
		"-width", "96", "-height", "64", "-resolution", "96", "-window", "3", "-steps", "2", "-seconds", "0.5", "-timeout", "2m"}
	t.Log(harness(args...))
	if again := harness(args...); strings.Count(again, "kept") != 3 {
		t.Errorf("second run did not keep every budget:\n%s", again)
	}
	rep := filepath.Join(out, "e2e.json")
	table := harness("-out", out, "-budgets", "cold,all,0.25", "-report", rep, "-gpu", "cpu", "-require", "3")
	t.Log(table)
	var r Report
	raw, err := os.ReadFile(rep)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Jobs) != 3 || r.Jobs[0].Budget != "cold" || r.Jobs[1].VsAll != 1 || r.Jobs[2].CapGiB < 0.249 || r.Jobs[2].CapGiB > 0.251 {
		t.Errorf("jobs %+v", r.Jobs)
	}
	// the tiny models never stream and the VAE tiles alike at every budget: the same video
	for _, j := range r.Jobs {
		if j.OutputSHA256 == "" || j.SameAsAll == nil || !*j.SameAsAll {
			t.Errorf("budget %s: output %q, same as all-resident: %v", j.Budget, j.OutputSHA256, j.SameAsAll)
		}
		if j.LatentsSHA256 == "" || j.LatentsSHA256 == j.OutputSHA256 || j.SameLatentsAsAll == nil || !*j.SameLatentsAsAll {
			t.Errorf("budget %s: latents %q, same as all-resident: %v", j.Budget, j.LatentsSHA256, j.SameLatentsAsAll)
		}
	}
	// -twice: the 0.25 GiB daemon ran a first job, and its rows are the second job's
	var b025 Budget
	if raw, err := os.ReadFile(filepath.Join(out, "budget-0.25.json")); err != nil || json.Unmarshal(raw, &b025) != nil {
		t.Fatalf("budget-0.25.json: %v", err)
	}
	if jobs, _ := filepath.Glob(filepath.Join(out, "state-0.25", "jobs", "*", "history", "stages.jsonl")); b025.FirstJobS <= 0 || len(jobs) != 2 {
		t.Errorf("-twice: first job %.2f s, %d jobs in the daemon's state", b025.FirstJobS, len(jobs))
	}
	// the conv decisions the cold job left reached the next budget's state (the cpu backend
	// records its tier decisions too)
	for _, b := range []string{"cold", "all"} {
		if _, err := os.Stat(filepath.Join(out, "state-"+b, cacheFiles[0])); err != nil {
			t.Errorf("budget %s: no conv decision cache in its state: %v", b, err)
		}
	}
	stages := map[string]bool{}
	for _, row := range r.Rows {
		stages[row.Stage] = true
	}
	for _, s := range []string{"STAGE_TEXT_ENCODE", "STAGE_VAE_ENCODE", "STAGE_IMAGE_ENCODE", "STAGE_TRANSFORMER", "STAGE_VAE_DECODE"} {
		if !stages[s] {
			t.Errorf("no row of %s", s)
		}
	}
	if !strings.Contains(table, "| all resident |") || !strings.Contains(table, "| 0.25 GB |") || !strings.Contains(table, "first job") {
		t.Errorf("table:\n%s", table)
	}
}

// TestSamplerWindows checks how device memory samples are matched to stages: the peak inside a
// stage's window, and kill → memory back as the first sample at the baseline after the kill,
// -1 when the next stage began first.
func TestSamplerWindows(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	s := &sampler{samples: []sample{{at(0), 500}, {at(100), 9000}, {at(200), 20000}, {at(300), 12000}, {at(400), 600}, {at(500), 700}, {at(600), 15000}}}
	if p := s.peakIn(at(50), at(350)); p != 20000 {
		t.Errorf("peak in window %v, want 20000", p)
	}
	if p := s.peakIn(at(700), at(800)); p != 0 {
		t.Errorf("peak of an empty window %v", p)
	}
	if b := s.backAfter(at(250), at(550), 756); b != 0.15 {
		t.Errorf("back after %v s, want 0.15", b)
	}
	if b := s.backAfter(at(250), at(350), 756); b != -1 {
		t.Errorf("back after %v s, want -1 (the next stage began first)", b)
	}
}

// TestReportRequire: -require fails a report whose rows show a peak over its cap, a worker
// stage without load numbers, or too few budgets, naming each problem; the JSON is still written.
func TestReportRequire(t *testing.T) {
	out := t.TempDir()
	ok := Row{Budget: "all", Stage: "STAGE_VAE_ENCODE", Worker: "vae", Seconds: 1, SpawnToReadyS: 0.1, LoadS: 0.2, LoadGBps: 1, PeakGiB: 1, CapGiB: 2, UnderCap: true}
	over := ok
	over.Budget, over.Stage, over.PeakGiB, over.UnderCap = "8", "STAGE_TRANSFORMER", 9, false
	noLoad := ok
	noLoad.Budget, noLoad.Stage, noLoad.LoadS, noLoad.LoadGBps = "8", "STAGE_TEXT_ENCODE", 0, 0
	for _, b := range []Budget{{Budget: "all", TotalS: 10, OK: true, Rows: []Row{ok}}, {Budget: "8", TotalS: 12, Rows: []Row{over, noLoad}}} {
		raw, _ := json.Marshal(b)
		if err := os.WriteFile(filepath.Join(out, "budget-"+b.Budget+".json"), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rep := filepath.Join(out, "r.json")
	err := report(options{out: out, budgets: "all,8,6", report: rep, minBudgets: 3})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"budget 8 stage STAGE_TRANSFORMER: peak 9.000 GiB over the cap 2.000 GiB", "budget 8 stage STAGE_TEXT_ENCODE: incomplete row", "2 budgets complete, 3 required", "budget 8: job failed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
	raw, err := os.ReadFile(rep)
	if err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal(raw, &r); err != nil || len(r.Jobs) != 2 || r.Jobs[1].VsAll != 1.2 {
		t.Errorf("report %s (%v)", raw, err)
	}
}
