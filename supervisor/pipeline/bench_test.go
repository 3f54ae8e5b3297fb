package pipeline_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/parity"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline"
)

// demoCase is the job `make demo` runs: testdata/demo/start.png, 2 s at window 3 (five
// sections), 4 steps, the tiny models' bucket table (resolution 96), no TeaCache.
func demoCase(tb testing.TB) i2vCase {
	tb.Helper()
	root, err := parity.ModuleRoot()
	if err != nil {
		tb.Fatal(err)
	}
	img, err := os.ReadFile(filepath.Join(root, "testdata", "demo", "start.png"))
	if err != nil {
		tb.Fatal(err)
	}
	spec := &framepackv1.JobSpec{Prompt: "The girl dances gracefully, with clear movements, full of charm.", Seed: proto.Int64(31337),
		TotalSecondLength: 2, LatentWindowSize: 3, Steps: 4, Resolution: 96, UseTeacache: proto.Bool(false), ImageFilename: "start.png"}
	return i2vCase{spec: spec, image: img, window: 3}
}

// BenchmarkDemoJob runs the demo job through the daemon (API on a unix socket, real worker
// processes, shared memory) and prints what every stage cost: spawn-to-ready, load, compute,
// teardown, the worker allocator's peak and the worker's peak RSS.
//
//	go test ./supervisor/pipeline -run '^$' -bench DemoJob -benchtime 3x
func BenchmarkDemoJob(b *testing.B) {
	jc := demoCase(b)
	workers := buildWorkers(b)
	var last []pipeline.StageRecord
	var jobTime time.Duration
	for b.Loop() {
		b.StopTimer()
		opts := newOpts(b, workers)
		opts.KeepHistory = false
		var st stageLog
		opts.onStage = st.onStage
		d, err := newDaemon(opts, testLogger())
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		t0 := time.Now()
		runJob(b, jc, opts.Socket)
		jobTime = time.Since(t0)
		b.StopTimer()
		d.Kill()
		st.mu.Lock()
		last = st.records
		for _, l := range st.leftover {
			b.Errorf("worker outlived its stage: %s", l)
		}
		st.mu.Unlock()
		b.StartTimer()
	}
	b.ReportMetric(jobTime.Seconds(), "s/job")
	// Printed, not logged: go test cuts benchmark logs to a few lines without -v.
	fmt.Println(stageTable(last, jobTime))
}

// stageTable renders stage records as a markdown table with per-stage-kind means.
func stageTable(recs []pipeline.StageRecord, job time.Duration) string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e6) }
	mib := func(n uint64) string {
		if n == 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f", float64(n)/(1<<20))
	}
	var sb strings.Builder
	sb.WriteString("| stage | section | worker | spawn→ready ms | load ms | compute ms | teardown ms | wall ms | alloc peak MiB | RSS peak MiB |\n")
	sb.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	type agg struct {
		n                                int
		spawn, load, compute, down, wall time.Duration
		alloc, rss                       uint64
	}
	kinds := map[string]*agg{}
	var order []string
	var total agg
	for _, r := range recs {
		sec := "–"
		if r.Section >= 0 {
			sec = fmt.Sprint(r.Section)
		}
		worker := r.Worker
		if worker == "" {
			worker = "(supervisor)"
		}
		name := strings.TrimPrefix(r.Name, "STAGE_")
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", strings.ToLower(name), sec, worker,
			ms(r.SpawnToReady), ms(r.Load), ms(r.Compute), ms(r.Teardown), ms(r.Wall), mib(r.AllocPeakBytes), mib(r.RSSPeakBytes))
		a := kinds[name]
		if a == nil {
			a = &agg{}
			kinds[name] = a
			order = append(order, name)
		}
		for _, x := range []*agg{a, &total} {
			x.n++
			x.spawn += r.SpawnToReady
			x.load += r.Load
			x.compute += r.Compute
			x.down += r.Teardown
			x.wall += r.Wall
			x.alloc = max(x.alloc, r.AllocPeakBytes)
			x.rss = max(x.rss, r.RSSPeakBytes)
		}
	}
	sb.WriteString("\nper stage kind (mean per run; peaks are maxima):\n\n")
	sb.WriteString("| stage | runs | spawn→ready ms | load ms | compute ms | teardown ms | wall ms | alloc peak MiB | RSS peak MiB |\n")
	sb.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, k := range order {
		a := kinds[k]
		n := time.Duration(a.n)
		fmt.Fprintf(&sb, "| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", strings.ToLower(k), a.n, ms(a.spawn/n), ms(a.load/n),
			ms(a.compute/n), ms(a.down/n), ms(a.wall/n), mib(a.alloc), mib(a.rss))
	}
	fmt.Fprintf(&sb, "\njob: %s ms wall (submit to finished event); stages: spawn→ready %s ms, load %s ms, compute %s ms, teardown %s ms in total\n",
		ms(job), ms(total.spawn), ms(total.load), ms(total.compute), ms(total.down))
	return sb.String()
}
