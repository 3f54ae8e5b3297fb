package watchdog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/framepackd/framepackd/internal/workerkit"
)

// Prober checks a lane's device in a throwaway process; nil means healthy.
type Prober func(ctx context.Context) error

// DefaultProbeAllocate is what the probe allocates, touches and frees on the device.
const DefaultProbeAllocate = 64 << 20

// ProbeWorker returns a Prober that starts the probe worker (cfg: its binary, socket dir,
// logger), asks it to list the backend's devices and allocate, touch and free allocate bytes on
// device index, and kills it. A device missing from the list, a failed allocation, a crash of
// the probe or its running past ctx's deadline make the device unhealthy.
func ProbeWorker(cfg workerkit.Config, backend string, index uint32, allocate uint64) Prober {
	if cfg.Name == "" {
		cfg.Name = "probe"
	}
	return func(ctx context.Context) error {
		p, err := workerkit.Start(ctx, cfg)
		if err != nil {
			return fmt.Errorf("probe: %w", err)
		}
		defer p.Close()
		done := make(chan struct{})
		defer close(done)
		go func() { // a probe stuck in a driver call ignores its context: kill it
			select {
			case <-ctx.Done():
				p.Kill()
			case <-done:
			}
		}()
		resp, err := p.Probe(ctx, &workerkit.ProbeRequest{Backend: backend, AllocateBytes: allocate, AllocateDeviceIndex: index})
		if err != nil {
			return fmt.Errorf("probe: %w", err)
		}
		found := false
		for _, d := range resp.Devices {
			found = found || d.Index == index
		}
		if !found {
			return fmt.Errorf("probe: %s device %d not found (%d devices)", resp.Backend, index, len(resp.Devices))
		}
		if a := resp.Allocate; allocate > 0 && (a == nil || !a.Succeeded) {
			msg := "no answer"
			if a != nil {
				msg = a.Error
			}
			return fmt.Errorf("probe: allocate %d bytes on %s device %d: %s", allocate, resp.Backend, index, msg)
		}
		return nil
	}
}

// Backoff is the wait between device probes of a degraded lane: Initial, doubling up to Max.
type Backoff struct {
	Initial, Max time.Duration
}

// DefaultBackoff is 2 s doubling up to 5 min.
var DefaultBackoff = Backoff{Initial: 2 * time.Second, Max: 5 * time.Minute}

// next returns the wait after d (0: the first).
func (b Backoff) next(d time.Duration) time.Duration {
	if b.Initial <= 0 {
		b.Initial = DefaultBackoff.Initial
	}
	if b.Max <= 0 {
		b.Max = DefaultBackoff.Max
	}
	if d <= 0 {
		return min(b.Initial, b.Max)
	}
	return min(2*d, b.Max)
}

// ErrNoProber is returned by RecoverDevice on a watchdog without a prober.
var ErrNoProber = errors.New("watchdog: no device prober configured")
