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
// retentionInterval, and asks Ready again every ReadyInterval: health turns NOT_SERVING (with
// the reason logged) while it fails and SERVING again once it passes (ready.go).
func (d *Daemon) housekeep(ctx context.Context) {
	interval := d.cfg.ReadyInterval
	if interval <= 0 {
		interval = DefaultReadyInterval
	}
	readyTick := time.NewTicker(interval)
	defer readyTick.Stop()
	sweepTick := time.NewTicker(retentionInterval)
	defer sweepTick.Stop()
	d.sweep()
	for {
		select {
		case <-ctx.Done():
			return
		case <-readyTick.C:
			d.server.refreshReady()
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
