package main

// The pipeline's part of the daemon: flags, lanes and the FramePack Runner
// (supervisor/pipeline, supervisor/lanes).

import (
	"context"
	"flag"
	"fmt"

	"github.com/sirupsen/logrus"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/devices"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/lanes"
	"github.com/framepackd/framepackd/supervisor/pipeline"
	"github.com/framepackd/framepackd/supervisor/watchdog"
)

// pipelineOptions are the pipeline's flags.
type pipelineOptions struct {
	residency   bool
	budgetGB    float64
	cpuMemGB    float64
	noPreviews  bool
	keepHistory bool
	siglip      string
	watchdog    func(lane string) *watchdog.Watchdog // the lanes' watchdogs, set by run (watchdog.go)
	// checkVariant checks JobSpec.variant at submit (pipeline.Runner.CheckVariant); set by
	// newRunner when the models are found, nil otherwise (only i2v accepted).
	checkVariant func(name string) error
	onStage      func(pipeline.StageRecord) // the metrics' stage hook, set by run (http.go)
}

// addPipelineFlags registers the pipeline's flags on fs.
func addPipelineFlags(fs *flag.FlagSet) *pipelineOptions {
	p := &pipelineOptions{}
	fs.BoolVar(&p.residency, "residency", false, "keep the transformer and VAE workers alive across sections when their measured footprints fit the memory budget together")
	fs.Float64Var(&p.budgetGB, "memory-budget-gb", 0, "memory the workers of a lane may hold together, for --residency (0: 80% of the device's memory)")
	fs.Float64Var(&p.cpuMemGB, "cpu-device-memory-gb", 0, "the device memory of a cpu lane, from which each job's worker memory cap is taken (less the job's gpu_memory_preservation_gb and a 1 GiB reserve); 0: the host's RAM")
	fs.BoolVar(&p.noPreviews, "no-previews", false, "do not make a preview image per sampling step")
	fs.BoolVar(&p.keepHistory, "keep-section-history", false, "keep every section's history file, not only the newest")
	fs.StringVar(&p.siglip, "siglip-processor", "", "SigLIP preprocessing: torchvision (transformers 5, the default) or pil (transformers 4)")
	return p
}

// newRunner builds the lanes and the pipeline Runner. When the models cannot be found the
// daemon still starts, and jobs fail saying why.
func newRunner(o *options, devs *devices.Prober, laneNames []string, log *logrus.Logger) (run func(context.Context, *jobs.Job, func(*framepackv1.JobEvent)) (jobs.Result, error), closeFn func(), err error) {
	p := o.pipeline
	root := o.shm.Root()
	byName := map[string]*lanes.Lane{}
	for _, name := range laneNames {
		lane, err := devices.ParseLane(name)
		if err != nil {
			return nil, nil, err
		}
		// The lane's device memory: the probed device's total (a GPU's memory; the host's RAM
		// for cpu, which --cpu-device-memory-gb replaces). Each job's worker cap is taken
		// from it (lanes.Lane.MemoryCap).
		dev := devs.Device(name)
		devMem, bus := dev.GetTotalMemoryBytes(), dev.GetPciBusId()
		if !lane.GPU() && p.cpuMemGB > 0 {
			devMem = uint64(p.cpuMemGB * (1 << 30))
		}
		budget := uint64(p.budgetGB * (1 << 30))
		if budget == 0 {
			budget = devMem / 10 * 8
		}
		if !lane.GPU() {
			bus = ""
		}
		l, err := lanes.New(lanes.Config{Name: name, Backend: lane.Backend, DeviceIndex: lane.Device(), PCIBusID: bus, WorkerPath: lanes.BinDir(o.workersDir),
			DeviceMemory: devMem, Residency: p.residency, Budget: budget, Log: logrus.NewEntry(log)})
		if err != nil {
			return nil, nil, err
		}
		byName[name] = l
	}
	closeAll := func() {
		for _, l := range byName {
			_ = l.Close()
		}
	}
	env := map[string]string{}
	if p.siglip != "" {
		env["FRAMEPACK_SIGLIP_PROCESSOR"] = p.siglip
	}
	models, err := pipeline.ResolveModels(o.models)
	if err != nil {
		log.WithError(err).Warn("model folders not found; jobs will fail until they exist (restart the daemon after downloading)")
		msg := "no pipeline can run: " + err.Error()
		return func(context.Context, *jobs.Job, func(*framepackv1.JobEvent)) (jobs.Result, error) {
			return jobs.Result{}, &jobs.FailureError{Failure: &framepackv1.JobFailure{Message: msg}}
		}, closeAll, nil
	}
	log.WithFields(logrus.Fields{"hunyuanvideo": models.HunyuanVideo, "flux_redux": models.FluxRedux, "transformer": models.Transformer,
		"transformer_f1": models.TransformerF1}).Info("models found")
	r, err := pipeline.New(pipeline.Config{
		Models: models, Shm: root, Log: log, WorkerEnv: env, Watchdog: p.watchdog,
		NoPreviews: p.noPreviews, KeepSectionHistory: p.keepHistory, Residency: p.residency, OnStage: p.onStage,
		KeepSectionVideos: o.limits.keepVideos, FreeBytes: api.FreeBytes, MaxImagePixels: o.limits.maxPixels,
		Lane: func(name string) (*lanes.Lane, error) {
			if l, ok := byName[name]; ok {
				return l, nil
			}
			return nil, fmt.Errorf("no lane %q", name)
		},
	})
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	p.checkVariant = r.CheckVariant
	return r.Run, closeAll, nil
}
