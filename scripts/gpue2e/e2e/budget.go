package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// stageRecord is the part of pipeline.StageRecord (stages.jsonl) the benchmark reads.
type stageRecord struct {
	Stage          string    `json:"stage"`
	Section        int       `json:"section"`
	Worker         string    `json:"worker"`
	Reused         bool      `json:"reused"`
	Kept           bool      `json:"kept"`
	CapBytes       uint64    `json:"cap_bytes"`
	Residency      string    `json:"residency"`
	Evicted        []string  `json:"evicted"`
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
	// CapGiB is the cap the worker reported it ran under; StageCapGiB the cap the lane gave
	// the stage (cap_bytes) and Residency why, and why the worker was kept or killed after it.
	CapGiB      float64  `json:"cap_gib"`
	StageCapGiB float64  `json:"stage_cap_gib,omitempty"`
	Residency   string   `json:"residency,omitempty"`
	Evicted     []string `json:"evicted,omitempty"`
	// RSSPeakGiB is the worker process's host RSS peak (the stage record's rss_peak_bytes).
	RSSPeakGiB float64 `json:"rss_peak_gib,omitempty"`
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
	Kept              bool    `json:"kept,omitempty"`
	Error             string  `json:"error,omitempty"`
}

// Section is one section of a budget's job: its stages (transformer, decode, write video).
type Section struct {
	Index int `json:"index"`
	// WallS is the section's stages' wall time, ComputeS their compute (the workers' Run calls,
	// the write stage's whole time), WriteS the write stage's.
	WallS    float64 `json:"wall_s"`
	ComputeS float64 `json:"compute_s"`
	WriteS   float64 `json:"write_video_s"`
	// DiskWriteBytes is the daemon tree's write_bytes from the section's first stage's start to
	// its last stage's end (host samples on both sides).
	DiskWriteBytes uint64 `json:"disk_write_bytes"`
}

// Budget is one budget's job.
type Budget struct {
	Budget    string  `json:"budget"`
	BudgetGB  float64 `json:"budget_gb"`
	DeviceGiB float64 `json:"device_gib"`
	// LaneMemoryGB is the daemon's --lane-memory-gb (0: none); CapGiB the lane's budget for
	// the job: the device less the 1 GiB reserve, at most LaneMemoryGB.
	LaneMemoryGB float64 `json:"lane_memory_gb,omitempty"`
	CapGiB       float64 `json:"cap_gib"`
	KeepAlive    string  `json:"keep_alive"`
	Seconds      float64 `json:"seconds"`
	Steps        int     `json:"steps"`
	// TotalS is the CLI's wall time (submit to the finished job's video in place: the daemon
	// writes it, the CLI copies nothing); WriteVideoS the write-video stages (blend, the
	// section's frames encoded, the checkpoint) and TotalNoVideoS the rest, to set beside a
	// FramePack run that writes no video.
	TotalS        float64 `json:"total_s"`
	WriteVideoS   float64 `json:"write_video_s"`
	TotalNoVideoS float64 `json:"total_without_video_s"`
	// OutputSHA256 hashes the final video's frames (the PNG files in order, or the MP4's frames
	// decoded to RGB): budgets whose VAE tiles alike must give the all-resident job's video bit
	// for bit (streaming blocks and layers changes no byte).
	OutputSHA256 string `json:"output_sha256,omitempty"`
	// LatentsSHA256 hashes the last section file's history_latents (the latents a resume
	// reads; history files hold no pixels): the transformer's output, which every budget must
	// give bit for bit even where the VAE tiles differently.
	LatentsSHA256 string `json:"latents_sha256,omitempty"`
	// FirstJobS is the wall time of the job the daemon ran before the measured one (keep,
	// -twice), FirstJobLoadS its spawn + load.
	FirstJobS     float64 `json:"first_job_s,omitempty"`
	FirstJobLoadS float64 `json:"first_job_load_s,omitempty"`
	JobS          float64 `json:"stages_s"`
	// LoadS is spawn → ready plus load of every stage; LoadShare LoadS / TotalS.
	LoadS     float64 `json:"load_s"`
	LoadShare float64 `json:"load_share"`
	// WorkerStages counts the stages run by a worker, ReusedStages those whose worker was
	// already alive (kept from an earlier stage or job), KeptStages those whose worker stayed
	// alive after the stage.
	WorkerStages int `json:"worker_stages"`
	ReusedStages int `json:"reused_stages"`
	KeptStages   int `json:"kept_stages"`
	// Sections and their sums; OnceS the once-per-job stages (encoders, prepare); GapS the
	// job's time outside every stage (the daemon between stages, the CLI).
	Sections         []Section `json:"sections"`
	SectionsWallS    float64   `json:"sections_wall_s"`
	SectionsComputeS float64   `json:"sections_compute_s"`
	OnceS            float64   `json:"once_s"`
	GapS             float64   `json:"gap_s"`
	MaxPeakGiB       float64   `json:"max_peak_gib"`
	AllUnderCap      bool      `json:"all_under_cap"`
	// NVMLBaselineGiB is the device's used memory before the daemon started, NVMLPeakGiB its
	// highest sample during the job above that (cuda lanes).
	NVMLBaselineGiB float64 `json:"nvml_baseline_gib,omitempty"`
	NVMLPeakGiB     float64 `json:"nvml_peak_gib,omitempty"`
	// Host memory during the measured job (every -host-every): the system's used memory
	// (MemTotal − MemAvailable) above its reading before the daemon started, the summed RSS of
	// the daemon and every process under it, and its anonymous + shmem part (the file pages
	// of the mapped checkpoints left out), the most processes seen; WorkerRSSPeakGiB is the
	// largest worker RSS peak of the stage records.
	HostBaselineGiB     float64 `json:"host_used_baseline_gib"`
	HostUsedPeakGiB     float64 `json:"host_used_peak_gib"`
	ProcsRSSPeakGiB     float64 `json:"procs_rss_peak_gib"`
	ProcsPrivatePeakGiB float64 `json:"procs_anon_shmem_peak_gib"`
	ProcsPeak           int     `json:"procs_peak"`
	WorkerRSSPeakGiB    float64 `json:"worker_rss_peak_gib"`
	// Disk: the daemon tree's write_bytes over the measured job (/proc/PID/io; a reaped
	// child's count joins its parent's), cancelled_write_bytes (files deleted before they
	// reached the disk) and wchar (every write call, pipes and sockets too); the file system of
	// the state folder (tmpfs writes are not counted); the final video (VideoPath: a file, or
	// a folder of PNG frames where the daemon has no ffmpeg) and the job's folder at the end.
	DiskWriteBytes     uint64 `json:"disk_write_bytes"`
	DiskCancelledBytes uint64 `json:"disk_cancelled_write_bytes"`
	WcharBytes         uint64 `json:"wchar_bytes"`
	StateFS            string `json:"state_fs"`
	VideoPath          string `json:"video_path,omitempty"`
	VideoFormat        string `json:"video_format,omitempty"`
	VideoBytes         int64  `json:"video_bytes"`
	JobDirBytes        int64  `json:"job_dir_bytes"`
	OK                 bool   `json:"ok"`
	Error              string `json:"error,omitempty"`
	// Note is what a finished job reports besides its video (frames saved as PNG files where
	// the server has no ffmpeg, as on the GPU machine).
	Note string `json:"note,omitempty"`
	// Weights and FP8Compute are what an fp8 budget's job asked for (`framepack generate
	// --weights fp8 --fp8-compute …`; empty: the checkpoint's bf16); WeightsFormat and
	// ServedFP8Compute what the job's settings (the JSON file beside its video) say the
	// transformer loaded: the 8-bit format ("quantized" for quantize-at-load) and the compute
	// mode the worker reported at load.
	Weights          string `json:"weights,omitempty"`
	FP8Compute       string `json:"fp8_compute,omitempty"`
	WeightsFormat    string `json:"weights_format,omitempty"`
	ServedFP8Compute string `json:"served_fp8_compute,omitempty"`
	Rows             []Row  `json:"rows,omitempty"`
	Params           string `json:"params"`
}

const gib = 1 << 30

// budgetSpec is how one budget's daemon and job are set up.
type budgetSpec struct {
	laneGB    float64 // --lane-memory-gb; 0: none
	seconds   float64
	steps     int
	twice     bool
	keepAlive time.Duration
	timeout   time.Duration
	coldCache bool
	// weights and fp8Compute are the job's --weights and --fp8-compute (fp8 budgets).
	weights, fp8Compute string
}

// fp8Prefix makes a budget an fp8 one: fp8-keep, fp8-all, fp8-cold, fp8-N run as keep, all,
// cold, N with the transformer quantized to fp8 at load.
const fp8Prefix = "fp8-"

// baseBudget splits an fp8 budget's name into the budget it behaves as and true; any other
// name is itself and false.
func baseBudget(b string) (string, bool) {
	return strings.CutPrefix(b, fp8Prefix)
}

func (o options) spec(b string) (budgetSpec, error) {
	s := budgetSpec{seconds: o.seconds, steps: o.steps, twice: o.twice[b], timeout: o.timeout}
	base, fp8 := baseBudget(b)
	switch base {
	case "all":
	case "cold":
		s.coldCache = true
	case "keep":
		s.twice, s.keepAlive = true, o.keepAlive
	case "long":
		if fp8 {
			return s, fmt.Errorf("budget %q: fp8- goes before a number of GiB, all, keep or cold", b)
		}
		s.laneGB, s.seconds, s.steps, s.timeout = o.longGB, o.longSeconds, o.longSteps, o.longTimeout
	default:
		v, err := strconv.ParseFloat(base, 64)
		if err != nil || v <= 0 {
			return s, fmt.Errorf("budget %q: want a number of GiB, all, keep, cold or long, or fp8- before a number, all, keep or cold", b)
		}
		s.laneGB = v
	}
	if fp8 {
		s.weights, s.fp8Compute = "fp8", o.fp8Compute
	}
	return s, nil
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

// jobRun is one `framepack generate --detach` + `framepack watch`.
type jobRun struct {
	secs  float64
	video string // the path watch printed: the final video or its PNG folder
	out   string // both commands' output
	err   error
}

func runBudget(o options, b string, dev float64, img string) (*Budget, error) {
	sp, err := o.spec(b)
	if err != nil {
		return nil, err
	}
	res := &Budget{Budget: b, DeviceGiB: dev, LaneMemoryGB: sp.laneGB, Seconds: sp.seconds, Steps: sp.steps, KeepAlive: sp.keepAlive.String(),
		Weights: sp.weights, FP8Compute: sp.fp8Compute,
		Params: fmt.Sprintf("%dx%d, resolution %d, window %d, %d steps, %g s, lane %s",
			o.width, o.height, o.resolution, o.window, sp.steps, sp.seconds, o.lane)}
	res.CapGiB = dev - 1
	if sp.laneGB > 0 {
		if sp.laneGB > dev-1 {
			return nil, fmt.Errorf("budget %g GiB is more than the device's %.2f GiB less the 1 GiB reserve", sp.laneGB, dev)
		}
		res.CapGiB = sp.laneGB
	}
	res.BudgetGB = res.CapGiB
	state := filepath.Join(o.out, "state-"+b)
	if err := os.RemoveAll(state); err != nil {
		return nil, err
	}
	res.StateFS = fsType(o.out)
	if !sp.coldCache {
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

	cuda := strings.HasPrefix(o.lane, "cuda")
	if cuda {
		if base, err := nvidiaSMI(laneIndex(o.lane), "memory.used"); err == nil {
			res.NVMLBaselineGiB = float64(base) / 1024
		}
	}
	baseUsed, _ := usedMemory()
	res.HostBaselineGiB = float64(baseUsed) / gib
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return nil, err
	}
	args := []string{"--models", o.models, "--state", state, "--socket", sock, "--lanes", o.lane, "--log-level", "info", "--workers-dir", bin}
	if o.lane == "cpu" || strings.HasPrefix(o.lane, "cpu:") {
		args = append(args, "--backend", "cpu", "--cpu-device-memory-gb", strconv.FormatFloat(dev, 'f', -1, 64))
	}
	if sp.laneGB > 0 {
		args = append(args, "--lane-memory-gb", strconv.FormatFloat(sp.laneGB, 'f', -1, 64))
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
	host := startHostSampler(d.Process.Pid, o.hostEvery)
	defer host.stop()
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
	gen := func() jobRun {
		ctx, cancel := context.WithTimeout(context.Background(), sp.timeout)
		defer cancel()
		t0 := time.Now()
		cli := func(args ...string) (string, string, error) {
			cmd := exec.CommandContext(ctx, filepath.Join(o.bin, "framepack"), append(args, "--addr", sock)...)
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			return stdout.String(), stderr.String(), err
		}
		args := []string{"generate", "--detach", "--image", img, "--prompt", o.prompt, "--seconds", fmt.Sprint(sp.seconds),
			"--window", fmt.Sprint(o.window), "--steps", fmt.Sprint(sp.steps), "--resolution", fmt.Sprint(o.resolution),
			"--teacache=false", "--lane", o.lane, "--gpu-preserve", "0", "--keep-alive", sp.keepAlive.String()}
		if sp.weights != "" {
			args = append(args, "--weights", sp.weights, "--fp8-compute", sp.fp8Compute)
		}
		id, msg, err := cli(args...)
		if err != nil {
			return jobRun{secs: time.Since(t0).Seconds(), out: id + msg, err: err}
		}
		stdout, stderr, err := cli("watch", strings.TrimSpace(id), "--quiet")
		return jobRun{secs: time.Since(t0).Seconds(), video: lastLines(stdout, 1), out: stdout + stderr, err: err}
	}
	if sp.twice {
		first := gen()
		res.FirstJobS = first.secs
		if _, msg := outcome(first.err, first.out); msg != "" {
			res.Error = "first job: " + msg
			return res, nil
		}
		if recs, _, err := readStages(state); err == nil {
			for _, r := range recs {
				res.FirstJobLoadS += sec(r.SpawnToReady) + sec(r.Load)
			}
		}
	}
	var smi *sampler
	if cuda {
		smi = startSampler(laneIndex(o.lane))
	}
	start := host.sample()
	job := gen()
	end := host.sample()
	res.TotalS = job.secs
	if smi != nil {
		if sp.keepAlive == 0 {
			// the job's workers are killed at its end: wait for the device's memory to come back
			smi.settle(res.NVMLBaselineGiB*1024+256, 10*time.Second)
		}
		if p := smi.stop(); p > 0 {
			res.NVMLPeakGiB = p - res.NVMLBaselineGiB
		}
	}
	p := host.peaks(start.at, end.at)
	res.HostUsedPeakGiB = float64(p.used-min(p.used, baseUsed)) / gib
	res.ProcsRSSPeakGiB, res.ProcsPrivatePeakGiB, res.ProcsPeak = float64(p.rss)/gib, float64(p.private)/gib, p.procs
	res.DiskWriteBytes = end.tree.writeBytes - min(end.tree.writeBytes, start.tree.writeBytes)
	res.DiskCancelledBytes = end.tree.cancelled - min(end.tree.cancelled, start.tree.cancelled)
	res.WcharBytes = end.tree.wchar - min(end.tree.wchar, start.tree.wchar)

	res.Note, res.Error = outcome(job.err, job.out)
	recs, history, err := readStages(state)
	if err != nil && res.Error == "" {
		res.Error = err.Error()
	}
	if history != "" {
		res.JobDirBytes = treeBytes(filepath.Dir(history))
	}
	if res.Error == "" {
		if err := res.hashOutputs(history, job.video); err != nil {
			res.Error = err.Error()
		} else if err := res.readWeights(job.video); err != nil {
			res.Error = err.Error()
		}
	}
	res.addRows(recs, smi, host)
	res.OK = res.Error == "" && res.AllUnderCap
	return res, nil
}

// addRows turns the job's stage records into rows, sections and the job's sums.
func (res *Budget) addRows(recs []stageRecord, smi *sampler, host *hostSampler) {
	b := res.Budget
	res.AllUnderCap = len(recs) > 0
	sections := map[int]*Section{}
	var order []int
	spans := map[int][2]time.Time{}
	for _, r := range recs {
		row := Row{Budget: b, BudgetGB: res.BudgetGB, Stage: r.Stage, Section: r.Section, Worker: r.Worker, Reused: r.Reused, Kept: r.Kept,
			Seconds: sec(r.Wall), SpawnToReadyS: sec(r.SpawnToReady), LoadS: sec(r.Load), ComputeS: sec(r.Compute),
			KillToReapedS: sec(r.Teardown), PeakGiB: float64(r.AllocPeakBytes) / gib, CapGiB: float64(r.MemoryCapBytes) / gib,
			StageCapGiB: float64(r.CapBytes) / gib, Residency: r.Residency, Evicted: r.Evicted, RSSPeakGiB: float64(r.RSSPeakBytes) / gib,
			WeightGB: float64(r.WeightBytes) / 1e9, ResidentBlocks: r.ResidentBlocks, StreamedBlocks: r.StreamedBlocks, Error: r.Err}
		if r.Load > 0 && r.WeightBytes > 0 {
			row.LoadGBps = float64(r.WeightBytes) / 1e9 / sec(r.Load)
		}
		row.UnderCap = r.Worker == "" || (r.MemoryCapBytes > 0 && r.AllocPeakBytes <= r.MemoryCapBytes)
		end := r.Start.Add(time.Duration(r.Wall))
		if smi != nil && r.Worker != "" && !r.Start.IsZero() {
			if p := smi.peakIn(r.Start, end); p > 0 {
				row.NVMLPeakGiB = p/1024 - res.NVMLBaselineGiB
			}
			if !r.Kept && r.Teardown > 0 {
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
			res.AllUnderCap = res.AllUnderCap && row.UnderCap
			res.WorkerStages++
			if r.Reused {
				res.ReusedStages++
			}
			if r.Kept {
				res.KeptStages++
			}
			res.WorkerRSSPeakGiB = math.Max(res.WorkerRSSPeakGiB, row.RSSPeakGiB)
		}
		if r.Stage == "STAGE_WRITE_VIDEO" {
			res.WriteVideoS += row.Seconds
		}
		if r.Section < 0 {
			res.OnceS += row.Seconds
		} else {
			s := sections[r.Section]
			if s == nil {
				s = &Section{Index: r.Section}
				sections[r.Section] = s
				order = append(order, r.Section)
				spans[r.Section] = [2]time.Time{r.Start, end}
			}
			s.WallS += row.Seconds
			s.ComputeS += row.ComputeS
			if r.Stage == "STAGE_WRITE_VIDEO" {
				s.WriteS += row.Seconds
			}
			sp := spans[r.Section]
			if r.Start.Before(sp[0]) {
				sp[0] = r.Start
			}
			if end.After(sp[1]) {
				sp[1] = end
			}
			spans[r.Section] = sp
			res.SectionsWallS += row.Seconds
			res.SectionsComputeS += row.ComputeS
		}
		res.JobS += row.Seconds
		res.LoadS += row.SpawnToReadyS + row.LoadS
		res.MaxPeakGiB = math.Max(res.MaxPeakGiB, row.PeakGiB)
		res.Rows = append(res.Rows, row)
	}
	for _, i := range order {
		s := sections[i]
		if host != nil {
			s.DiskWriteBytes = host.writesIn(spans[i][0], spans[i][1])
		}
		res.Sections = append(res.Sections, *s)
	}
	if res.TotalS > 0 {
		res.LoadShare = res.LoadS / res.TotalS
		res.TotalNoVideoS = res.TotalS - res.WriteVideoS
		res.GapS = res.TotalS - res.JobS
	}
}

func sec(ns int64) float64 { return float64(ns) / 1e9 }

// readStages reads the stage records of the latest job under state and its history folder.
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
