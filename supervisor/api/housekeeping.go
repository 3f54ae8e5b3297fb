package api

import (
	"context"
	"time"

	"github.com/sirupsen/logrus"
)

// DefaultReadyInterval is how often the daemon re-checks its readiness (DaemonConfig.Ready).
const DefaultReadyInterval = 5 * time.Second

// retentionInterval is how often the retention policy is applied besides at start.
const retentionInterval = 10 * time.Minute

// housekeep runs until ctx ends: it applies the retention policy at start and every
// retentionInterval, and turns health NOT_SERVING (with the reason logged) while Ready fails.
func (d *Daemon) housekeep(ctx context.Context) {
	ready := d.cfg.Ready
	interval := d.cfg.ReadyInterval
	if interval <= 0 {
		interval = DefaultReadyInterval
	}
	readyTick := time.NewTicker(interval)
	defer readyTick.Stop()
	sweepTick := time.NewTicker(retentionInterval)
	defer sweepTick.Stop()
	check := func() {
		if ready == nil {
			return
		}
		reason := ""
		if err := ready(); err != nil {
			reason = err.Error()
		}
		d.setReady(reason)
	}
	d.sweep()
	for {
		select {
		case <-ctx.Done():
			return
		case <-readyTick.C:
			check()
		case <-sweepTick.C:
			d.sweep()
		}
	}
}

// sweep deletes the finished jobs the retention policy does not keep.
func (d *Daemon) sweep() {
	if !d.cfg.Retention.Enabled() {
		return
	}
	removed, err := d.store.Sweep(d.cfg.Retention)
	if len(removed) > 0 {
		d.log.WithFields(logrus.Fields{"jobs": removed, "max_age": d.cfg.Retention.MaxAge, "max_bytes": d.cfg.Retention.MaxBytes}).Info("retention: deleted finished jobs")
	}
	if err != nil {
		d.log.WithError(err).Warn("retention sweep")
	}
}

// Sweep applies the retention policy now (tests, and after a job ends).
func (d *Daemon) Sweep() { d.sweep() }

// setReady sets health from a readiness check: NOT_SERVING with the reason logged, or SERVING
// again; only changes are logged. The first call (from StartDaemon, before serving) logs a
// failure only.
func (d *Daemon) setReady(reason string) {
	d.readyMu.Lock()
	defer d.readyMu.Unlock()
	if d.readyChecked && reason == d.notReady {
		return
	}
	first := !d.readyChecked
	d.readyChecked, d.notReady = true, reason
	if reason != "" {
		d.log.WithField("reason", reason).Warn("not ready: health is NOT_SERVING and jobs are refused")
		d.server.SetServing(false)
		return
	}
	if !first {
		d.log.Info("ready again: health is SERVING")
	}
	d.server.SetServing(true)
}
