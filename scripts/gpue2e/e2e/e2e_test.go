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
// then the harness runs the job through a real framepackd and the CLI on a cpu lane of 3 GiB
// (a 2 GiB budget: the four workers' caps fit together) at four budgets: keep (no lane limit,
// keep-alive on: the daemon runs the job twice and the second, on the workers the first left
// alive, is measured), all (no limit), 0.25 (the daemon's --lane-memory-gb: no two workers
// fit), and long (a 5-section job at 1 GiB, where the transformer and the VAE stay: time and
// disk writes per section).
// -report -require 4 checks that every job finished, every worker stage has its spawn, load,
// GB/s, peak and cap, every peak is under its cap and the keep job reused every worker. A
// second harness run keeps every budget (resumable).
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
	const budgets = "keep,all,0.25,fp8-all,fp8-0.25,long"
	args := []string{"-bin", bin, "-models", models, "-out", out, "-lane", "cpu", "-device-gib", "3", "-budgets", budgets,
		"-width", "96", "-height", "64", "-resolution", "96", "-window", "3", "-steps", "2", "-seconds", "0.5", "-timeout", "2m",
		"-long-seconds", "2", "-long-steps", "1", "-long-gb", "1", "-long-timeout", "4m"}
	t.Log(harness(args...))
	if again := harness(args...); strings.Count(again, "kept") != 6 {
		t.Errorf("second run did not keep every budget:\n%s", again)
	}
	rep := filepath.Join(out, "e2e.json")
	table := harness("-out", out, "-budgets", budgets, "-report", rep, "-gpu", "cpu", "-require", "6")
	t.Log(table)
	var r Report
	raw, err := os.ReadFile(rep)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	jobs := map[string]JobTotal{}
	for _, j := range r.Jobs {
		jobs[j.Budget.Budget] = j
	}
	if len(r.Jobs) != 6 || jobs["all"].VsAll != 1 || jobs["0.25"].CapGiB != 0.25 || jobs["0.25"].LaneMemoryGB != 0.25 || jobs["all"].LaneMemoryGB != 0 {
		t.Errorf("jobs %+v", r.Jobs)
	}
	// keep: the daemon's second job found every worker the first left alive
	if k := jobs["keep"]; k.FirstJobS <= 0 || k.WorkerStages == 0 || k.ReusedStages != k.WorkerStages || k.LoadS != 0 || k.KeepAlive != "10m0s" {
		t.Errorf("keep: first job %.2f s, %d of %d worker stages reused, load %.2f s, keep-alive %s", k.FirstJobS, k.ReusedStages, k.WorkerStages, k.LoadS, k.KeepAlive)
	}
	if a := jobs["all"]; a.ReusedStages == a.WorkerStages || a.KeepAlive != "0s" {
		t.Errorf("all: %d of %d worker stages reused (a fresh daemon's job loads its workers), keep-alive %s", a.ReusedStages, a.WorkerStages, a.KeepAlive)
	}
	// the tiny models never stream and the VAE tiles alike at every budget: the same video (fp8
	// budgets: the fp8-all job's, which is not the bf16 one's); the long job is another video
	for _, j := range r.Jobs {
		b := j.Budget.Budget
		if _, fp8 := baseBudget(b); fp8 {
			if j.Weights != "fp8" || j.FP8Compute != "token" || j.WeightsFormat != "quantized" || j.ServedFP8Compute != "token" ||
				j.BitReference != "fp8-all" || j.LatentsSHA256 == jobs["all"].LatentsSHA256 || j.TransformerRSSGiB <= 0 {
				t.Errorf("budget %s: weights %q %q, settings report %q %q, compared with %q, latents %q (bf16 all %q), transformer RSS %.3f GiB",
					b, j.Weights, j.FP8Compute, j.WeightsFormat, j.ServedFP8Compute, j.BitReference, j.LatentsSHA256, jobs["all"].LatentsSHA256, j.TransformerRSSGiB)
			}
		} else if j.Weights != "" || j.WeightsFormat != "" || (b != "long" && j.BitReference != "all") {
			t.Errorf("budget %s: weights %q, settings report %q, compared with %q", b, j.Weights, j.WeightsFormat, j.BitReference)
		}
		if j.OutputSHA256 == "" || j.LatentsSHA256 == "" || j.LatentsSHA256 == j.OutputSHA256 || j.VideoBytes <= 0 || j.VideoFormat == "" {
			t.Errorf("budget %s: output %q, latents %q, video %s %d bytes", b, j.OutputSHA256, j.LatentsSHA256, j.VideoFormat, j.VideoBytes)
		}
		if b == "long" {
			if j.SameAsAll != nil || j.SameLatentsAsAll != nil || j.OutputSHA256 == jobs["all"].OutputSHA256 {
				t.Errorf("long: compared with the all-resident job: %v %v", j.SameAsAll, j.SameLatentsAsAll)
			}
		} else if j.SameAsAll == nil || !*j.SameAsAll || j.SameLatentsAsAll == nil || !*j.SameLatentsAsAll {
			t.Errorf("budget %s: same output as all-resident: %v, same latents: %v", b, j.SameAsAll, j.SameLatentsAsAll)
		}
		// host memory: the system's baseline, the tree's RSS (daemon and workers), every worker's peak
		if j.HostBaselineGiB <= 0 || j.ProcsRSSPeakGiB <= 0 || j.ProcsPrivatePeakGiB <= 0 || j.ProcsPeak < 2 || j.WorkerRSSPeakGiB <= 0 {
			t.Errorf("budget %s: host baseline %.2f GiB, RSS %.3f GiB (anon+shmem %.3f) over %d processes, worker RSS %.3f GiB",
				b, j.HostBaselineGiB, j.ProcsRSSPeakGiB, j.ProcsPrivatePeakGiB, j.ProcsPeak, j.WorkerRSSPeakGiB)
		}
		if j.WriteVideoS <= 0 || j.TotalNoVideoS <= 0 || j.TotalNoVideoS >= j.TotalS || j.SectionsComputeS <= 0 || j.OnceS <= 0 {
			t.Errorf("budget %s: total %.2f s, without video %.2f s, sections' compute %.2f s, once %.2f s", b, j.TotalS, j.TotalNoVideoS, j.SectionsComputeS, j.OnceS)
		}
		// disk writes are counted where the state folder is on a disk (tmpfs writes are not)
		if j.StateFS != "tmpfs" && (j.DiskWriteBytes == 0 || j.WcharBytes == 0) {
			t.Errorf("budget %s: state on %s, %d bytes written, wchar %d", b, j.StateFS, j.DiskWriteBytes, j.WcharBytes)
		}
	}
	// long: five sections, each with its stages, and the summary
	if l := jobs["long"]; len(l.Sections) != 5 || l.Seconds != 2 || l.Steps != 1 || r.Long == nil || r.Long.TotalOverCompute <= 1 || r.Long.First.N != 2 || r.Long.Last.N != 2 {
		t.Errorf("long: %d sections %+v, summary %+v", len(l.Sections), l.Sections, r.Long)
	} else if l.StateFS != "tmpfs" && (r.Long.WritesOverVideo <= 0 || r.Long.Last.DiskWriteMB <= 0) {
		t.Errorf("long: disk writes %+v", r.Long)
	}
	// the conv decisions the first job left reached the next budget's state (the cpu backend
	// records its tier decisions too)
	for _, b := range []string{"keep", "all"} {
		if _, err := os.Stat(filepath.Join(out, "state-"+b, cacheFiles[0])); err != nil {
			t.Errorf("budget %s: no conv decision cache in its state: %v", b, err)
		}
	}
	stages := map[string]bool{}
	for _, row := range r.Rows {
		stages[row.Stage] = true
		if row.Worker != "" && (row.StageCapGiB <= 0 || row.Residency == "") {
			t.Errorf("budget %s stage %s: stage cap %.3f GiB, residency %q", row.Budget, row.Stage, row.StageCapGiB, row.Residency)
		}
	}
	for _, s := range []string{"STAGE_TEXT_ENCODE", "STAGE_VAE_ENCODE", "STAGE_IMAGE_ENCODE", "STAGE_TRANSFORMER", "STAGE_VAE_DECODE", "STAGE_WRITE_VIDEO"} {
		if !stages[s] {
			t.Errorf("no row of %s", s)
		}
	}
	for _, want := range []string{"| measure |", "| all resident |", "| 0.25 GB |", "first job", "long (2 s)", "Long job (2 s, 5 sections", "not run",
		"| 0.25 GB, fp8 weights (token) |", "| 0.5 s job at 0.25 GB: fp8 weights (token) vs our bf16, time without video | fp8 ", "| host RAM at 16 GB: fp8 weights vs our bf16, transformer worker RSS peak | not run |"} {
		if !strings.Contains(table, want) {
			t.Errorf("table has no %q:\n%s", want, table)
		}
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
