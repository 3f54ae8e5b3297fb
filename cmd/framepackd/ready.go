package main

// Readiness: whether the daemon can run jobs now, what health says, and which jobs SubmitJob
// refuses at once instead of accepting jobs that can never run.

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/shm"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/pipeline"
)

// readiness checks the shared-memory folder, the model files (at start, on every readiness
// check, which the daemon makes every few seconds, and on every ListDevices) and the lanes'
// devices.
type readiness struct {
	shm    *shm.Instance
	models string // --models
	log    logrus.FieldLogger

	mu        sync.Mutex // mu protects modelsErr, info and laneErr
	modelsErr error      // why the FramePack variant cannot run; nil when it can
	info      pipeline.ModelInfo
	laneErr   map[string]string // lane → why it is unusable; absent when usable
}

func newReadiness(inst *shm.Instance, models string, devs *devices, log logrus.FieldLogger) *readiness {
	r := &readiness{shm: inst, models: models, log: log, laneErr: map[string]string{}}
	r.checkModels()
	r.observeDevices(devs.known())
	return r
}

// checkModels re-reads the model folders: they exist and every header parses.
func (r *readiness) checkModels() {
	var info pipeline.ModelInfo
	m, err := pipeline.ResolveModels(r.models)
	if err == nil {
		info, err = pipeline.CheckModels(m)
	}
	r.mu.Lock()
	changed := (err == nil) != (r.modelsErr == nil)
	r.modelsErr, r.info = err, info
	r.mu.Unlock()
	switch {
	case err != nil && changed:
		r.log.WithError(err).Warn("framepack variant unusable: jobs are refused until its model files are fixed")
	case changed:
		r.log.Info("model files usable again")
	}
}

// observeDevices records which lanes have a device (ListDevices's answer).
func (r *readiness) observeDevices(devs []*framepackv1.Device) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.laneErr = map[string]string{}
	for _, d := range devs {
		if d.GetName() == "" && d.GetLaneState() == framepackv1.LaneState_LANE_STATE_DEGRADED {
			r.laneErr[d.GetLane()] = "lane " + d.GetLane() + ": " + d.GetLaneStateReason()
		}
	}
}

// devices wraps the device lister: every ListDevices also re-checks the models and the lanes.
func (r *readiness) devices(list func(context.Context) ([]*framepackv1.Device, error)) func(context.Context) ([]*framepackv1.Device, error) {
	return func(ctx context.Context) ([]*framepackv1.Device, error) {
		r.checkModels()
		devs, err := list(ctx)
		if err == nil {
			r.observeDevices(devs)
		}
		return devs, err
	}
}

// ready is the daemon's readiness (health SERVING when nil): its shared-memory folder is
// there (made again if it vanished) and the FramePack variant's model files are usable, read
// again now (a models folder that appears after start makes the daemon ready).
func (r *readiness) ready() error {
	if err := r.shm.Check(); err != nil {
		return err
	}
	r.checkModels()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.modelsErr != nil {
		return fmt.Errorf("no variant can run: framepack: %w", r.modelsErr)
	}
	return nil
}

// admit refuses, at submit, a job that cannot run: its lane has no device. (Whether the
// models take the job's resolution is the API's to judge, from models.)
func (r *readiness) admit(spec *framepackv1.JobSpec) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if lane := spec.GetLane(); lane != "" {
		if why, bad := r.laneErr[lane]; bad {
			return errors.New(why)
		}
	}
	return nil
}

// fit is what the served models take (api.Config.Models): nil until their files are
// usable.
func (r *readiness) fit() api.ModelFit {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.modelsErr != nil {
		return nil
	}
	return r.info
}

// known lists the daemon's lanes with the devices of the last probe, without probing again.
func (d *devices) known() []*framepackv1.Device {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*framepackv1.Device, 0, len(d.lanes))
	for _, lane := range d.lanes {
		dev, ok := d.last[lane]
		if !ok {
			dev = &framepackv1.Device{Lane: lane, LaneState: framepackv1.LaneState_LANE_STATE_DEGRADED,
				LaneStateReason: "no device for this lane in the last probe"}
		}
		out = append(out, dev)
	}
	return out
}
