package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/tensorio"
	"github.com/framepackd/framepackd/workers/transformer/conditioning"
	"github.com/framepackd/framepackd/workers/transformer/dit"
)

// forwardPlan is a validated TransformerForwardRequest: the noisy latents, the model's
// conditioning, and where the velocity goes.
type forwardPlan struct {
	x     conditioning.Tensor
	shape [5]int
	cond  conditioning.Conditioning
}

// planForward checks the request and reads its input tensors.
func (w *worker) planForward(req *workerkit.TransformerForwardRequest) (*forwardPlan, error) {
	for name, v := range map[string]float32{"timestep": req.Timestep, "guidance": req.Guidance} {
		if err := finite(name, v); err != nil {
			return nil, err
		}
	}
	if err := tensorio.CheckFloatOutput("velocity", req.Velocity); err != nil {
		return nil, err
	}
	if w.model.ImageProjection != nil && req.ImageEmbeddings.Path == "" && req.ImageEmbeddings.Name == "" {
		return nil, workerkit.InvalidArgumentf("image_embeddings is required: the model has an image projection")
	}
	var in inputs
	x := in.float("hidden_states", req.HiddenStates, 5)
	cond := in.conditioning(req.TransformerConditioning)
	if in.err != nil {
		return nil, in.err
	}
	if err := tensorio.CheckShape("velocity", req.Velocity, tensorio.Shape64(x.Shape)); err != nil {
		return nil, err
	}
	return &forwardPlan{x: x, shape: [5]int(x.Shape), cond: cond}, nil
}

// forward runs one transformer forward: prepare the conditioning for the latents' shape, run
// the model once, write the velocity.
func (w *worker) forward(ctx context.Context, req *workerkit.TransformerForwardRequest, emit workerkit.Emit, start time.Time, log *logrus.Entry) (*workerkit.Result, error) {
	fp, err := w.planForward(req)
	if err != nil {
		return nil, err
	}
	send := func(phase string) error {
		if emit == nil {
			return ctx.Err()
		}
		if err := emit(&workerkit.Progress{Phase: phase, Elapsed: time.Since(start)}); err != nil {
			return fmt.Errorf("emit: %w", err)
		}
		return nil
	}
	if err := send("prepare"); err != nil {
		return nil, err
	}
	m := w.model
	sec, err := m.Prepare(fp.cond, fp.shape)
	if err != nil {
		return nil, err
	}
	defer sec.Close()
	if err := send("forward"); err != nil {
		return nil, err
	}
	w.base.Beacon.SetStep(1, 1)
	v, err := m.Forward(ctx, sec, fp.x.Data, req.Timestep, req.Guidance, dit.ForwardOptions{})
	w.base.Beacon.SetStep(0, 0)
	w.base.Beacon.SetBytes(int64(w.rt.Memory().Allocated))
	if err != nil {
		return nil, err
	}
	if err := send("write"); err != nil {
		return nil, err
	}
	written, err := tensorio.WriteFloat("velocity", req.Velocity, v, tensorio.Shape64(fp.shape[:]))
	if err != nil {
		return nil, fmt.Errorf("velocity: %w", err)
	}
	imgTokens, encTokens := sec.Tokens()
	log.WithFields(logrus.Fields{"shape": fmt.Sprint(fp.shape), "image_tokens": imgTokens, "encoder_tokens": encTokens}).Info("forward done")
	return &workerkit.Result{Outputs: []workerkit.TensorRef{written}, Stats: w.base.Stats()}, nil
}
