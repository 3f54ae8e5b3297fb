package lanes

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/framepackd/framepackd/internal/workerkit"
)

// estimateTimeout bounds one estimate: a worker's start plus reading a model's config and its
// checkpoint's headers.
const estimateTimeout = 2 * time.Minute

// Estimate asks st's worker what its model needs for st's workload, before anything loads: it
// starts a worker of st.Model that only answers Estimate (it opens no backend and touches no
// device, so it runs while another worker holds the lane's GPU) and kills it. decodeFrames is
// the most latent frames one VAE decode takes (0 for other models). Answers are cached by
// request for the lane's life. A worker without an estimate fails with
// workerkit.ErrNoEstimate; the caller then runs the stage without a Need.
func (l *Lane) Estimate(ctx context.Context, st Stage, decodeFrames uint32) (Need, error) {
	key := fmt.Sprintf("%s\x00%d", LoadKey(st), decodeFrames)
	l.mu.Lock()
	n, ok := l.estimates[key]
	l.mu.Unlock()
	if ok {
		return n, nil
	}
	path, err := l.cfg.WorkerPath(st.Model)
	if err != nil {
		return Need{}, fmt.Errorf("estimate %s: %w", st.Model, err)
	}
	ctx, cancel := context.WithTimeout(ctx, estimateTimeout)
	defer cancel()
	proc, err := l.cfg.Start(ctx, workerkit.Config{Name: string(st.Model) + "-estimate", Path: path, StartTimeout: l.cfg.StartTimeout,
		SocketDir: l.cfg.SocketDir, Env: l.cfg.Env, Log: l.log})
	if err != nil {
		return Need{}, fmt.Errorf("estimate %s: %w", st.Model, err)
	}
	resp, err := proc.Estimate(ctx, &workerkit.EstimateRequest{Load: *l.loadRequest(st, 0), VAEDecodeLatentFrames: decodeFrames})
	if terr := l.teardown(proc); terr != nil {
		err = errors.Join(err, terr)
	}
	if err != nil {
		return Need{}, fmt.Errorf("estimate %s: %w", st.Model, err)
	}
	n = Need{Min: resp.MinDeviceBytes, Full: max(resp.FullDeviceBytes, resp.MinDeviceBytes)}
	l.mu.Lock()
	l.estimates[key] = n
	l.mu.Unlock()
	l.log.WithFields(map[string]any{"worker": string(st.Model), "min": n.Min, "full": n.Full, "weights": resp.WeightBytes,
		"host_at_min": resp.HostBytesAtMin}).Debug("memory estimate")
	return n, nil
}
