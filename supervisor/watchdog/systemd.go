package watchdog

import (
	"context"
	"fmt"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/sirupsen/logrus"
)

// Notifier speaks systemd's notify protocol for the daemon (deploy/framepackd.service:
// Type=notify, WatchdogSec=): READY=1 once it serves, STOPPING=1 when it drains, STATUS= lines,
// and WATCHDOG=1 pings from the daemon's main loop while that loop is healthy, so systemd
// restarts a daemon that stopped making progress. Without NOTIFY_SOCKET (not under systemd)
// every call does nothing.
type Notifier struct {
	log *logrus.Entry

	// notify and watchdogEnabled are go-systemd's; tests replace them.
	notify          func(unsetEnv bool, state string) (bool, error)
	watchdogEnabled func(unsetEnv bool) (time.Duration, error)
}

// NewNotifier returns a Notifier for the daemon's main loop.
func NewNotifier(log *logrus.Entry) *Notifier {
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	return &Notifier{log: log, notify: daemon.SdNotify, watchdogEnabled: daemon.SdWatchdogEnabled}
}

func (n *Notifier) send(state string) error {
	if _, err := n.notify(false, state); err != nil {
		return fmt.Errorf("sd_notify %q: %w", state, err)
	}
	return nil
}

// Ready tells systemd the daemon serves, with a status line.
func (n *Notifier) Ready(status string) error {
	return n.send(daemon.SdNotifyReady + "\nSTATUS=" + status)
}

// Stopping tells systemd the daemon is draining.
func (n *Notifier) Stopping() error { return n.send(daemon.SdNotifyStopping) }

// Status sets the status line systemctl shows.
func (n *Notifier) Status(status string) error { return n.send("STATUS=" + status) }

// Run sends WATCHDOG=1 at half the unit's WatchdogSec while healthy returns nil, until ctx
// ends. When healthy fails the pings stop (systemd restarts the service once WatchdogSec
// passes) and the failure is logged; a later success resumes them. status, if not nil, is
// sent as the STATUS= line with every ping when it changes (e.g. the lanes' health). Without a
// systemd watchdog Run returns at once.
func (n *Notifier) Run(ctx context.Context, healthy func(context.Context) error, status func() string) error {
	every, err := n.watchdogEnabled(false)
	if err != nil {
		return fmt.Errorf("systemd watchdog: %w", err)
	}
	if every <= 0 {
		return nil
	}
	every /= 2
	t := time.NewTicker(every)
	defer t.Stop()
	last := ""
	failing := false
	for {
		hctx, cancel := context.WithTimeout(ctx, every)
		err := healthy(hctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			if !failing {
				n.log.WithError(err).Error("systemd watchdog: daemon unhealthy; withholding WATCHDOG=1 pings")
			}
			failing = true
		default:
			if failing {
				n.log.Info("systemd watchdog: daemon healthy again; pings resume")
			}
			failing = false
			msg := daemon.SdNotifyWatchdog
			if status != nil {
				if s := status(); s != last {
					msg += "\nSTATUS=" + s
					last = s
				}
			}
			if err := n.send(msg); err != nil {
				n.log.WithError(err).Warn("systemd watchdog ping")
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// LanesStatus is a STATUS= line for the lanes' health ("cpu healthy; cuda:0 held: ...").
func LanesStatus(ws []*Watchdog) string {
	s := ""
	for i, w := range ws {
		if i > 0 {
			s += "; "
		}
		st := w.Health().Status()
		s += st.Lane + " " + st.State.String()
		if st.Reason != "" {
			s += ": " + st.Reason
		}
	}
	return s
}
