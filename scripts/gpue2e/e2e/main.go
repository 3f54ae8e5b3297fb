// Command e2e is the end-to-end benchmark (issues 17 and 30): one real job through a real
// framepackd and the CLI (`framepack generate --detach`, then `framepack watch`), once per
// memory budget, each budget a fresh daemon whose lane is limited to it (--lane-memory-gb).
// Per stage it reads the job's stage records (state/jobs/ID/history/stages.jsonl): spawn →
// ready, load time and GB/s, compute, kill → reaped, the worker allocator's peak against its
// cap, the cap the lane gave it and why (residency), whether it was reused or kept, its host RSS
// peak, resident and streamed blocks. Per job: the CLI's wall time, the share spent loading,
// the time without the video-writing stages; the host's used memory and the summed RSS of the
// daemon and every process under it (every 250 ms); the daemon tree's disk writes
// (/proc/PID/io) and the size of the final video; per section: wall, compute and disk writes;
// on a cuda lane, the device's used memory (nvidia-smi every 50 ms).
//
// Budgets: a number (GiB: the lane's limit), all (no limit), keep (no limit, keep-alive on:
// the daemon runs the job twice and the second, on warm workers, is measured), cold (as all,
// with no conv decisions or cuDNN Find results yet), long (a -long-seconds job at -long-gb with
// -long-steps: time and disk writes against the length), fp8-keep, fp8-all, fp8-cold, fp8-N (as
// keep, all, cold, N with the job's transformer quantized to fp8 at load: `--weights fp8
// --fp8-compute` -fp8-compute).
//
// Resumable: each budget's result is OUT/budget-<b>.json, and a budget whose file exists is not
// run again. -report merges the budgets found and FramePack's runs (framepack_e2e.py) into one
// JSON file and prints the goals table of issue 30 and the README tables.
//
//	e2e -bin bin -models ROOT -out DIR -lane cuda:0 -budgets keep,all,24,16,8,6,long
//	e2e -bin bin -models ROOT -out DIR -lane cuda:0 -budgets fp8-keep,fp8-16,fp8-6 -fp8-compute token
//	e2e -out DIR -report docs/bench/2026-11-29-h200-e2e.json [-framepack DIR/framepack.json] -gpu H200
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
}

type options struct {
	bin, models, out, lane, budgets, prompt string
	deviceGiB                               float64
	width, height, resolution, window       int
	steps                                   int
	seconds                                 float64
	timeout                                 time.Duration
	// the long budget's job
	longSeconds, longGB float64
	longSteps           int
	longTimeout         time.Duration
	keepAlive           time.Duration
	hostEvery           time.Duration
	report, framepack   string
	fp8Compute          string
	gpu                 string
	minBudgets          int
	limit               time.Duration
	// twice are the budgets whose daemon runs the job once before the measured one (a
	// long-lived daemon's steady state at that cap: its conv shapes found and cached); keep
	// always does, with its workers kept alive for the second job.
	twice map[string]bool
}

// defaultBudgets is the GPU run's list (scripts/gpue2e/README.md).
const defaultBudgets = "keep,all,24,16,8,6,long"

func run() error {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "folder of framepackd, framepack and the worker binaries")
	flag.StringVar(&o.models, "models", "", "model root (mkmodels' -out)")
	flag.StringVar(&o.out, "out", "", "results folder (one budget-<b>.json per budget; existing ones are kept)")
	flag.StringVar(&o.lane, "lane", "cuda:0", "lane to run on (cuda:N, hip:N or cpu)")
	flag.StringVar(&o.budgets, "budgets", defaultBudgets, "comma-separated: a number of GiB (the lane's --lane-memory-gb); all: no limit; keep: no limit, keep-alive on, the second of two jobs measured; cold: as all with empty conv caches; long: the -long-* job; fp8-keep, fp8-all, fp8-cold, fp8-N: as keep, all, cold, N with the transformer quantized to fp8 at load")
	flag.StringVar(&o.fp8Compute, "fp8-compute", "token", "the fp8 budgets' --fp8-compute: weight_only, tensor or token")
	flag.Float64Var(&o.deviceGiB, "device-gib", 0, "the lane's device memory in GiB (cpu: given to framepackd as --cpu-device-memory-gb; cuda: 0 reads nvidia-smi)")
	flag.IntVar(&o.width, "width", 704, "input image width (the bucket follows its aspect)")
	flag.IntVar(&o.height, "height", 544, "input image height")
	flag.IntVar(&o.resolution, "resolution", 640, "bucket resolution")
	flag.IntVar(&o.window, "window", 9, "latent window size")
	flag.IntVar(&o.steps, "steps", 25, "sampling steps")
	flag.Float64Var(&o.seconds, "seconds", 4, "video length (4 s at window 9: 3 sections)")
	flag.StringVar(&o.prompt, "prompt", "The girl dances gracefully, with clear movements, full of charm.", "prompt")
	flag.DurationVar(&o.timeout, "timeout", 9*time.Minute, "limit of one job")
	flag.Float64Var(&o.longSeconds, "long-seconds", 60, "the long budget's video length")
	flag.Float64Var(&o.longGB, "long-gb", 16, "the long budget's lane limit in GiB")
	flag.IntVar(&o.longSteps, "long-steps", 5, "the long budget's sampling steps")
	flag.DurationVar(&o.longTimeout, "long-timeout", 40*time.Minute, "limit of the long job")
	flag.DurationVar(&o.keepAlive, "keep-alive", 10*time.Minute, "the keep budget's JobSpec.keep_alive (every other budget's jobs ask for 0)")
	flag.DurationVar(&o.hostEvery, "host-every", 250*time.Millisecond, "host memory sampling interval")
	flag.StringVar(&o.report, "report", "", "merge the results into this JSON file and print the tables (no runs)")
	flag.StringVar(&o.framepack, "framepack", "", "FramePack's results (framepack_e2e.py's JSON) to merge into -report")
	flag.StringVar(&o.gpu, "gpu", "", "device name for -report")
	twice := flag.String("twice", "", "budgets (comma-separated) whose daemon runs the job once before the measured one: the steady state of a daemon at that cap, whose conv shapes (VAE tiles) the budgets before it may not have had")
	flag.IntVar(&o.minBudgets, "require", 0, "with -report: fail unless this many budgets are complete, every stage has its numbers and every peak is under its cap")
	flag.DurationVar(&o.limit, "limit", 0, "stop before a budget that would end past this much time from the start (the budget before it taken as its estimate); 0: no limit")
	flag.Parse()
	if o.out == "" {
		return errors.New("-out is required")
	}
	o.twice = map[string]bool{}
	for _, b := range splitList(*twice) {
		o.twice[b] = true
	}
	switch o.fp8Compute {
	case "weight_only", "tensor", "token":
	default:
		return fmt.Errorf("-fp8-compute %q: want weight_only, tensor or token", o.fp8Compute)
	}
	if o.report != "" {
		return report(o)
	}
	if o.models == "" {
		return errors.New("-models is required")
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	dev := o.deviceGiB
	if dev == 0 {
		if !strings.HasPrefix(o.lane, "cuda") {
			return errors.New("-device-gib is required on a lane other than cuda")
		}
		mib, err := nvidiaSMI(laneIndex(o.lane), "memory.total")
		if err != nil {
			return err
		}
		dev = float64(mib) / 1024
	}
	img := filepath.Join(o.out, "start.png")
	if err := writeImage(img, o.width, o.height); err != nil {
		return err
	}
	start := time.Now()
	var last time.Duration
	for _, b := range splitList(o.budgets) {
		path := filepath.Join(o.out, "budget-"+b+".json")
		if _, err := os.Stat(path); err == nil {
			fmt.Printf("e2e budget %s: kept %s\n", b, path)
			continue
		}
		if o.limit > 0 && last > 0 && time.Since(start)+last*5/4 > o.limit {
			fmt.Printf("e2e: stopping before budget %s: %v spent, the last budget took %v, the limit is %v (run again to go on)\n",
				b, time.Since(start).Round(time.Second), last.Round(time.Second), o.limit)
			return nil
		}
		t0 := time.Now()
		fmt.Printf("e2e budget %s: started %s\n", b, t0.UTC().Format(time.TimeOnly))
		res, err := runBudget(o, b, dev, img)
		last = time.Since(t0)
		if err != nil {
			return fmt.Errorf("budget %s: %w", b, err)
		}
		raw, _ := json.MarshalIndent(res, "", " ")
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			return err
		}
		fmt.Printf("e2e budget %s: %sjob %.1f s (%.1f s without writing video), load share %.1f %%, %d/%d worker stages reused, lane budget %.2f GiB, max peak %.2f GiB, host used +%.1f GiB, our RSS %.1f GiB, disk writes %.0f MB, video %.0f MB, ok=%v %s\n",
			b, res.weightsNote(), res.TotalS, res.TotalNoVideoS, 100*res.LoadShare, res.ReusedStages, res.WorkerStages, res.CapGiB, res.MaxPeakGiB,
			res.HostUsedPeakGiB, res.ProcsRSSPeakGiB, float64(res.DiskWriteBytes)/1e6, float64(res.VideoBytes)/1e6, res.OK, res.Error)
	}
	return nil
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}
