package sampler_test

import (
	"context"
	"fmt"

	"github.com/framepackd/framepackd/internal/torchrng"
	"github.com/framepackd/framepackd/workers/transformer/sampler"
)

// zeroVelocity stands in for the transformer worker's model.
type zeroVelocity struct{}

func (zeroVelocity) Forward(_ context.Context, in sampler.ForwardInput) ([]float32, error) {
	return make([]float32, len(in.X)), nil
}

// One job, two sections: one generator made from the job's seed, its state saved after each
// section and restored before the next (as a new worker process would), exactly as FramePack
// draws each section's noise from the job's torch.Generator.
func ExampleSample() {
	ctx := context.Background()
	var state []byte
	for section := 0; section < 2; section++ {
		g := torchrng.New(31337)
		if state != nil {
			if err := g.UnmarshalBinary(state); err != nil {
				panic(err)
			}
		}
		shape := sampler.LatentShape(1, 96, 64, 9) // [1, 16, 3, 8, 12]
		noise, err := g.Randn(shape.Ints())
		if err != nil {
			panic(err)
		}
		opts := sampler.DefaultOptions() // 25 steps, gs 10, cfg 1, bf16, UniPC bh1
		opts.Steps = 4
		opts.OnStep = func(s sampler.StepInfo) error { return nil } // previews, progress, cancel
		pos := &sampler.Conditioning{ /* text, image embeddings, clean latents */ }
		latents, err := sampler.Sample(ctx, zeroVelocity{}, sampler.Request{Noise: noise, Shape: shape, Positive: pos, Options: opts})
		if err != nil {
			panic(err)
		}
		state, _ = g.MarshalBinary() // saved with the section's latents
		fmt.Println(section, len(latents), len(state))
	}
	// Output:
	// 0 4608 2526
	// 1 4608 2526
}
