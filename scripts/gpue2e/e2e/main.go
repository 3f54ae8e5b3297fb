// Command e2e is the end-to-end memory benchmark (issue 17): one real job through a real
// framepackd and the CLI (`framepack generate`), once per memory budget, each budget set as the
// job's gpu_memory_preservation_gb so that the lane's worker cap (device memory − preservation −
// the lane's 1 GiB reserve) equals it. Per stage it reads the job's stage records
// (state/jobs/ID/history/stages.jsonl): spawn → ready, load time and GB/s (weight bytes / load),
// compute, kill → reaped, the worker allocator's peak against its cap, resident and streamed
// blocks. Per job: the CLI's wall time and the share spent loading; on a cuda lane, the device's
// used memory sampled by nvidia-smi every 100 ms (baseline before the daemon starts).
//
// Resumable: each budget's result is OUT/budget-<b>.json, and a budget whose file exists is not
// run again (the GPU machine allows 10 minutes a command: one call per budget or two). -report
// merges the budgets found (and FramePack's rows, from framepack_e2e.py) into one JSON file and
// prints the table for the README.
//
//	e2e -bin bin -models ROOT -out DIR -lane cuda:0 -budgets all,24,16,8,6
//	e2e -out DIR -report docs/bench/2026-11-25-h100-e2e.json [-framepack DIR/framepack.json] -gpu H100
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/framepackd/framepackd/internal/safetensors"
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
	report, framepack, gpu                  string
	minBudgets                              int
	limit                                   time.Duration
	// twice are the budgets whose daemon runs the job once before the measured one (a
	// long-lived daemon's steady state at that cap: its conv shapes found and cached)
	twice map[string]bool
}

func run() error {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "folder of framepackd, framepack and the worker binaries")
	flag.StringVar(&o.models, "models", "", "model root (mkmodels' -out)")
	flag.StringVar(&o.out, "out", "", "results folder (one budget-<b>.json per budget; existing ones are kept)")
	flag.StringVar(&o.lane, "lane", "cuda:0", "lane to run on (cuda:N, hip:N or cpu)")
	flag.StringVar(&o.budgets, "budgets", "cold,all,24,16,8,6", "worker memory caps in GiB; all: the whole device less the reserve; cold: as all, with no conv decisions or cuDNN Find results yet (a fresh daemon's first job)")
	flag.Float64Var(&o.deviceGiB, "device-gib", 0, "the lane's device memory in GiB (cpu: given to framepackd as --cpu-device-memory-gb; cuda: 0 reads nvidia-smi)")
	flag.IntVar(&o.width, "width", 704, "input image width (the bucket follows its aspect)")
	flag.IntVar(&o.height, "height", 544, "input image height")
	flag.IntVar(&o.resolution, "resolution", 640, "bucket resolution")
	flag.IntVar(&o.window, "window", 9, "latent window size")
	flag.IntVar(&o.steps, "steps", 25, "sampling steps")
	flag.Float64Var(&o.seconds, "seconds", 1, "video length")
	flag.StringVar(&o.prompt, "prompt", "The girl dances gracefully, with clear movements, full of charm.", "prompt")
	flag.DurationVar(&o.timeout, "timeout", 9*time.Minute, "limit of one job")
	flag.StringVar(&o.report, "report", "", "merge the results into this JSON file and print the table (no runs)")
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
	for _, b := range strings.Split(*twice, ",") {
		if b = strings.TrimSpace(b); b != "" {
			o.twice[b] = true
		}
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
	for _, b := range strings.Split(o.budgets, ",") {
		b = strings.TrimSpace(b)
		if b == "" {
			continue
		}
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
		res, err := runBudget(o, b, dev, img)
		last = time.Since(t0)
		if err != nil {
			return fmt.Errorf("budget %s: %w", b, err)
		}
		raw, _ := json.MarshalIndent(res, "", " ")
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			return err
		}
		fmt.Printf("e2e budget %s: job %.1f s, load share %.1f %%, cap %.2f GiB, max peak %.2f GiB, ok=%v %s\n",
			b, res.TotalS, 100*res.LoadShare, res.CapGiB, res.MaxPeakGiB, res.OK, res.Error)
	}
	return nil
}

// stageRecord is the part of pipeline.StageRecord (stages.jsonl) the benchmark reads.
type stageRecord struct {
	Stage          string    `json:"stage"`
	Section        int       `json:"section"`
	Worker         string    `json:"worker"`
	Reused         bool      `json:"reused"`
	Start          time.Time `json:"start"`
	Wall           int64     `json:"wall_ns"`
	SpawnToReady   int64     `json:"spawn_to_ready_ns"`
	Load           int64     `json:"load_ns"`
	Compute        int64     `json:"compute_ns"`
	Teardown       int64     `json:"teardown_ns"`
	AllocPeakBytes uint64    `json:"alloc_peak_bytes"`
	MemoryCapBytes uint64    `json:"memory_cap_bytes"`
	RSSPeakBytes   uint64    `json:"rss_peak_bytes"`
	WeightBytes    uint64    `json:"weight_bytes"`
	ResidentBlocks uint32    `json:"resident_blocks"`
	StreamedBlocks uint32    `json:"streamed_blocks"`
	Err            string    `json:"error"`
}

// Row is one stage of one budget's job.
type Row struct {
	Budget        string  `json:"budget"`
	BudgetGB      float64 `json:"budget_gb"`
	Stage         string  `json:"stage"`
	Section       int     `json:"section"`
	Worker        string  `json:"worker,omitempty"`
	Seconds       float64 `json:"seconds"`
	SpawnToReadyS float64 `json:"spawn_to_ready_s"`
	LoadS         float64 `json:"load_s"`
	LoadGBps      float64 `json:"load_gbps"`
	ComputeS      float64 `json:"compute_s"`
	KillToReapedS float64 `json:"kill_to_reaped_s"`
	PeakGiB       float64 `json:"peak_gib"`
	CapGiB        float64 `json:"cap_gib"`
	// NVMLPeakGiB is the device's used memory above the baseline while the stage ran;
	// KillToMemoryBackS the time from the worker's kill until it was back at the baseline
	// (+ 256 MiB), -1 when it was not back before the next stage began (cuda lanes).
	NVMLPeakGiB       float64 `json:"nvml_peak_gib,omitempty"`
	KillToMemoryBackS float64 `json:"kill_to_memory_back_s,omitempty"`
	UnderCap          bool    `json:"under_cap"`
	WeightGB          float64 `json:"weight_gb"`
	ResidentBlocks    uint32  `json:"resident_blocks,omitempty"`
	StreamedBlocks    uint32  `json:"streamed_blocks,omitempty"`
	Reused            bool    `json:"reused,omitempty"`
	Error             string  `json:"error,omitempty"`
}

// Budget is one budget's job.
type Budget struct {
	Budget     string  `json:"budget"`
	BudgetGB   float64 `json:"budget_gb"`
	DeviceGiB  float64 `json:"device_gib"`
	PreserveGB float64 `json:"gpu_memory_preservation_gb"`
	CapGiB     float64 `json:"cap_gib"`
	// TotalS is the CLI's wall time (submit to video copied); JobS the stages' sum.
	TotalS float64 `json:"total_s"`
	// OutputSHA256 hashes the job's section files (latents and pixels in f32, before the video
	// is encoded, whose metadata names the job): budgets whose VAE tiles alike must give the
	// all-resident job's output bit for bit (streaming blocks and layers changes no byte).
	OutputSHA256 string `json:"output_sha256,omitempty"`
	// LatentsSHA256 hashes only the section files' latents (history_latents): the transformer's
	// output, which every budget must give bit for bit even where the VAE tiles differently.
	LatentsSHA256 string `json:"latents_sha256,omitempty"`
	// FirstJobS is the wall time of the job the daemon ran before the measured one (-twice).
	FirstJobS float64 `json:"first_job_s,omitempty"`
	JobS      float64 `json:"stages_s"`
	// LoadS is spawn → ready plus load of every stage; LoadShare LoadS / TotalS.
	LoadS       float64 `json:"load_s"`
	LoadShare   float64 `json:"load_share"`
	MaxPeakGiB  float64 `json:"max_peak_gib"`
	AllUnderCap bool    `json:"all_under_cap"`
	// NVMLBaselineGiB is the device's used memory before the daemon started, NVMLPeakGiB its
	// highest sample during the job above that (cuda lanes).
	NVMLBaselineGiB float64 `json:"nvml_baseline_gib,omitempty"`
	NVMLPeakGiB     float64 `json:"nvml_peak_gib,omitempty"`
	OK              bool    `json:"ok"`
	Error           string  `json:"error,omitempty"`
	// Note is what a finished job reports besides its video (frames saved as PNG files where
	// the server has no ffmpeg, as on the GPU machine).
	Note   string `json:"note,omitempty"`
	Rows   []Row  `json:"rows"`
	Params string `json:"params"`
}

const gib = 1 << 30

// exitPNGFrames is the framepack CLI's exit status for a job that finished with its frames
// saved as PNG files because the server has no ffmpeg (cmd/framepack).
const exitPNGFrames = 8

// outcome reads the CLI's exit: a note for a job that finished with its frames saved as PNG
// files (the server has no ffmpeg), an error for any other failure.
func outcome(genErr error, out string) (note, errMsg string) {
	var exit *exec.ExitError
	switch {
	case errors.As(genErr, &exit) && exit.ExitCode() == exitPNGFrames:
		return "frames saved as PNG: " + lastLines(out, 1), ""
	case genErr != nil:
		return "", fmt.Sprintf("framepack generate: %v: %s", genErr, lastLines(out, 5))
	}
	return "", ""
}

// sectionHashes returns the SHA-256 of a job's section files in its history folder (their
// latents, pixels and generator state in f32, before any video encoding) and that of their
// history_latents tensors alone, in name order, reading each file once.
func sectionHashes(history string) (output, latents string, err error) {
	files, _ := filepath.Glob(filepath.Join(history, "section-*.safetensors"))
	if len(files) == 0 {
		return "", "", fmt.Errorf("no section files in %s", history)
	}
	sort.Strings(files)
	ho, hl := sha256.New(), sha256.New()
	for _, name := range files {
		raw, err := os.ReadFile(name)
		if err != nil {
			return "", "", err
		}
		ho.Write(raw)
		h, err := safetensors.ParseHeader(raw, int64(len(raw)))
		if err != nil {
			return "", "", fmt.Errorf("%s: %w", name, err)
		}
		t, ok := h.Lookup("history_latents")
		if !ok {
			return "", "", fmt.Errorf("%s: no tensor history_latents", name)
		}
		hl.Write(raw[h.DataStart+t.Begin : h.DataStart+t.End])
	}
	return hex.EncodeToString(ho.Sum(nil)), hex.EncodeToString(hl.Sum(nil)), nil
}

// cacheFiles are what a daemon keeps in its state folder across jobs that make a worker faster
// the second time: the conv decision cache and the cuDNN Find database beside it
// (cmd/framepackd, workers/vae). Every budget but "cold" starts with the ones the jobs before
// it left, as a long-lived daemon's next job does; "cold" shows the first job's cost.
var cacheFiles = []string{"conv-decisions.json", "conv-decisions.json.cudnn-find"}

// copyCaches copies cacheFiles that exist in from into to.
func copyCaches(from, to string) error {
	if err := os.MkdirAll(to, 0o755); err != nil {
		return err
	}
	for _, f := range cacheFiles {
		raw, err := os.ReadFile(filepath.Join(from, f))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(to, f), raw, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func runBudget(o options, b string, dev float64, img string) (*Budget, error) {
	res := &Budget{Budget: b, DeviceGiB: dev, Params: fmt.Sprintf("%dx%d, resolution %d, window %d, %d steps, %g s, lane %s",
		o.width, o.height, o.resolution, o.window, o.steps, o.seconds, o.lane)}
	if b == "all" || b == "cold" {
		res.BudgetGB = dev - 1
	} else {
		v, err := strconv.ParseFloat(b, 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("budget %q: want a number of GiB or all", b)
		}
		res.BudgetGB = v
		res.PreserveGB = dev - 1 - v
		if res.PreserveGB < 0 {
			return nil, fmt.Errorf("budget %g GiB is more than the device's %.2f GiB less the 1 GiB reserve", v, dev)
		}
		// the daemon takes whole bytes of the float32 preservation: round down to a MiB so
		// the cap lands on or just above the budget, never below it
		res.PreserveGB = math.Floor(res.PreserveGB*1024) / 1024
	}
	state := filepath.Join(o.out, "state-"+b)
	if err := os.RemoveAll(state); err != nil {
		return nil, err
	}
	if b != "cold" {
		// the daemon's conv decisions and cuDNN Find results as an earlier job left them
		if err := copyCaches(filepath.Join(o.out, "caches"), state); err != nil {
			return nil, err
		}
	}
	defer func() {
		if err := copyCaches(state, filepath.Join(o.out, "caches")); err != nil {
			fmt.Printf("e2e budget %s: keeping its caches: %v\n", b, err)
		}
	}()
	sockDir, err := os.MkdirTemp("", "fpk-e2e")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(sockDir)
	sock := filepath.Join(sockDir, "d.sock")

	var smi *sampler
	if strings.HasPrefix(o.lane, "cuda") {
		if base, err := nvidiaSMI(laneIndex(o.lane), "memory.used"); err == nil {
			res.NVMLBaselineGiB = float64(base) / 1024
		}
	}
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return nil, err
	}
	args := []string{"--models", o.models, "--state", state, "--socket", sock, "--lanes", o.lane, "--log-level", "info", "--workers-dir", bin}
	if o.lane == "cpu" || strings.HasPrefix(o.lane, "cpu:") {
		args = append(args, "--backend", "cpu", "--cpu-device-memory-gb", strconv.FormatFloat(dev, 'f', -1, 64))
	}
	logf, err := os.Create(filepath.Join(o.out, "framepackd-"+b+".log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	d := exec.Command(filepath.Join(o.bin, "framepackd"), args...)
	d.Stdout, d.Stderr = logf, logf
	if err := d.Start(); err != nil {
		return nil, fmt.Errorf("start framepackd: %w", err)
	}
	exited := make(chan struct{}) // closed once the daemon has exited
	var waitErr error
	go func() { waitErr = d.Wait(); close(exited) }()
	defer stopDaemon(d, exited)
	if err := waitReady(o.bin, sock, exited); err != nil {
		if errors.Is(err, errExited) {
			err = fmt.Errorf("%w: %v", err, waitErr)
		}
		log, _ := os.ReadFile(logf.Name())
		return nil, fmt.Errorf("%w (log %s: %s)", err, logf.Name(), lastLines(string(log), 5))
	}
	gen := func(video string) (float64, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(o.bin, "framepack"), "generate", "--addr", sock, "--image", img,
			"--prompt", o.prompt, "--seconds", fmt.Sprint(o.seconds), "--window", fmt.Sprint(o.window), "--steps", fmt.Sprint(o.steps),
			"--resolution", fmt.Sprint(o.resolution), "--teacache=false", "--lane", o.lane,
			"--gpu-preserve", strconv.FormatFloat(res.PreserveGB, 'f', -1, 64), "--out", video, "--quiet")
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		t0 := time.Now()
		err := cmd.Run()
		return time.Since(t0).Seconds(), out.String(), err
	}
	if o.twice[b] {
		secs, out, err := gen(filepath.Join(o.out, "video-"+b+"-first.mp4"))
		res.FirstJobS = secs
		if _, msg := outcome(err, out); msg != "" {
			res.Error = "first job: " + msg
			return res, nil
		}
	}
	if strings.HasPrefix(o.lane, "cuda") {
		smi = startSampler(laneIndex(o.lane))
	}
	var genOut string
	var genErr error
	res.TotalS, genOut, genErr = gen(filepath.Join(o.out, "video-"+b+".mp4"))
	if smi != nil {
		smi.settle(float64(res.NVMLBaselineGiB)*1024+256, 10*time.Second)
		if p := smi.stop(); p > 0 {
			res.NVMLPeakGiB = p - res.NVMLBaselineGiB
		}
	}
	res.Note, res.Error = outcome(genErr, genOut)
	recs, history, err := readStages(state)
	if err != nil && res.Error == "" {
		res.Error = err.Error()
	}
	if res.Error == "" {
		if res.OutputSHA256, res.LatentsSHA256, err = sectionHashes(history); err != nil {
			res.Error = err.Error()
		}
	}
	res.AllUnderCap = len(recs) > 0
	for _, r := range recs {
		row := Row{Budget: b, BudgetGB: res.BudgetGB, Stage: r.Stage, Section: r.Section, Worker: r.Worker, Reused: r.Reused,
			Seconds: sec(r.Wall), SpawnToReadyS: sec(r.SpawnToReady), LoadS: sec(r.Load), ComputeS: sec(r.Compute),
			KillToReapedS: sec(r.Teardown), PeakGiB: float64(r.AllocPeakBytes) / gib, CapGiB: float64(r.MemoryCapBytes) / gib,
			WeightGB: float64(r.WeightBytes) / 1e9, ResidentBlocks: r.ResidentBlocks, StreamedBlocks: r.StreamedBlocks, Error: r.Err}
		if r.Load > 0 && r.WeightBytes > 0 {
			row.LoadGBps = float64(r.WeightBytes) / 1e9 / sec(r.Load)
		}
		row.UnderCap = r.Worker == "" || (r.MemoryCapBytes > 0 && r.AllocPeakBytes <= r.MemoryCapBytes)
		if smi != nil && r.Worker != "" && !r.Start.IsZero() {
			end := r.Start.Add(time.Duration(r.Wall))
			if p := smi.peakIn(r.Start, end); p > 0 {
				row.NVMLPeakGiB = p/1024 - res.NVMLBaselineGiB
			}
			if !r.Reused && r.Teardown > 0 {
				next := time.Time{}
				for _, q := range recs {
					if q.Start.After(r.Start) && (next.IsZero() || q.Start.Before(next)) && q.Worker != "" {
						next = q.Start
					}
				}
				row.KillToMemoryBackS = smi.backAfter(end.Add(-time.Duration(r.Teardown)), next, res.NVMLBaselineGiB*1024+256)
			}
		}
		if r.Worker != "" {
			if row.CapGiB > 0 {
				res.CapGiB = row.CapGiB
			}
			res.AllUnderCap = res.AllUnderCap && row.UnderCap
		}
		res.JobS += row.Seconds
		res.LoadS += row.SpawnToReadyS + row.LoadS
		res.MaxPeakGiB = math.Max(res.MaxPeakGiB, row.PeakGiB)
		res.Rows = append(res.Rows, row)
	}
	if res.TotalS > 0 {
		res.LoadShare = res.LoadS / res.TotalS
	}
	res.OK = res.Error == "" && res.AllUnderCap
	return res, nil
}

func sec(ns int64) float64 { return float64(ns) / 1e9 }

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// readStages reads the stage records of the one job under state.
func readStages(state string) ([]stageRecord, string, error) {
	files, _ := filepath.Glob(filepath.Join(state, "jobs", "*", "history", "stages.jsonl"))
	if len(files) == 0 {
		return nil, "", fmt.Errorf("no job's stages.jsonl under %s", state)
	}
	var last []stageRecord
	history := ""
	for _, name := range files {
		recs, err := readStageFile(name)
		if err != nil {
			return nil, "", err
		}
		if len(recs) > 0 && (last == nil || recs[0].Start.After(last[0].Start)) {
			last, history = recs, filepath.Dir(name)
		}
	}
	return last, history, nil
}

// readStageFile reads one job's stage records.
func readStageFile(name string) ([]stageRecord, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []stageRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r stageRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// waitReady waits for the daemon's socket and a healthy answer.
var errExited = errors.New("framepackd exited before it was ready")

func waitReady(bin, sock string, exited <-chan struct{}) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errExited
		default:
		}
		if _, err := os.Stat(sock); err == nil {
			if exec.Command(filepath.Join(bin, "framepack"), "health", "--addr", sock, "--timeout", "5s").Run() == nil {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("framepackd not ready after 2 minutes")
}

func stopDaemon(d *exec.Cmd, exited <-chan struct{}) {
	_ = d.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		_ = d.Process.Kill()
		<-exited
	}
}

func laneIndex(lane string) string {
	_, idx, ok := strings.Cut(lane, ":")
	if !ok {
		return "0"
	}
	return idx
}

// nvidiaSMI reads one memory figure (MiB) of GPU idx.
func nvidiaSMI(idx, field string) (int64, error) {
	out, err := exec.Command("nvidia-smi", "--query-gpu="+field, "--format=csv,noheader,nounits", "-i", idx).Output()
	if err != nil {
		return 0, fmt.Errorf("nvidia-smi %s: %w", field, err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("nvidia-smi %s: %q: %w", field, out, err)
	}
	return v, nil
}

// sampler follows the GPU's used memory through nvidia-smi's loop mode (every 50 ms).
type sampler struct {
	cmd     *exec.Cmd
	mu      sync.Mutex
	samples []sample
	done    chan struct{}
}

type sample struct {
	at  time.Time
	mib float64
}

func startSampler(idx string) *sampler {
	s := &sampler{done: make(chan struct{})}
	s.cmd = exec.Command("nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", idx, "-lms", "50")
	out, err := s.cmd.StdoutPipe()
	if err != nil || s.cmd.Start() != nil {
		close(s.done)
		return s
	}
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if v, err := strconv.ParseFloat(strings.TrimSpace(sc.Text()), 64); err == nil {
				s.mu.Lock()
				s.samples = append(s.samples, sample{time.Now(), v})
				s.mu.Unlock()
			}
		}
	}()
	return s
}

// settle waits until a sample is at most mib, or for limit.
func (s *sampler) settle(mib float64, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		n := len(s.samples)
		back := n > 0 && s.samples[n-1].mib <= mib
		s.mu.Unlock()
		if back {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// peakIn is the highest sample (MiB) in [from, to], 0 when none.
func (s *sampler) peakIn(from, to time.Time) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var p float64
	for _, x := range s.samples {
		if !x.at.Before(from) && !x.at.After(to) {
			p = max(p, x.mib)
		}
	}
	return p
}

// backAfter is the time from kill to the first sample at most mib, -1 when none came before
// next (zero: no limit).
func (s *sampler) backAfter(kill, next time.Time, mib float64) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, x := range s.samples {
		if x.at.Before(kill) {
			continue
		}
		if !next.IsZero() && x.at.After(next) {
			break
		}
		if x.mib <= mib {
			return x.at.Sub(kill).Seconds()
		}
	}
	return -1
}

// stop ends the sampling and returns the peak in GiB.
func (s *sampler) stop() float64 {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.done
		_ = s.cmd.Wait()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var p float64
	for _, x := range s.samples {
		p = max(p, x.mib)
	}
	return p / 1024
}

// writeImage writes a w × h gradient PNG (the job's start frame; its aspect picks the bucket).
func writeImage(path string, w, h int) error {
	im := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			im.Set(x, y, color.RGBA{uint8(255 * x / w), uint8(255 * y / h), uint8((x ^ y) & 255), 255})
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, im); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
