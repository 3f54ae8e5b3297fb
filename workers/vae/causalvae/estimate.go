package causalvae

import (
	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
)

// Estimates before a load (the vae worker's Estimate): the same candidates and peaks an
// automatic tiling chooses from (Candidates, ChooseTiling), computed from the config alone.

// Need returns, for an input of shape in, the tiling an unbounded budget would choose (the least
// work: what the fastest run holds) and the smallest one (the least memory any tiling holds),
// with their estimated peaks beside the weights.
func (c Config) Need(in [5]int, encode bool, o FootprintOptions) (fastest, least TilingChoice, err error) {
	cands, err := (&Model{Config: c}).Candidates(in, encode, o)
	if err != nil {
		return TilingChoice{}, TilingChoice{}, err
	}
	best := 0
	for i, ch := range cands {
		if b := cands[best]; ch.Work < b.Work || (ch.Work == b.Work && ch.Runs < b.Runs) {
			best = i
		}
	}
	return cands[best], cands[len(cands)-1], nil
}

// EstimateWeights is the size of cfg's weights as LoadFrom uploads them from src with o (the
// narrowing resnets' split halves, a few percent more, are not counted).
func EstimateWeights(cfg Config, src nn.Source, o Options) int64 {
	l := nn.NewShapeLoaderFor(o)
	m := &Model{Config: cfg}
	m.bind(l)
	return l.ShapeBytes(src, "")
}

// FootprintFor is Footprint for a model not loaded yet, to run on backend ("cpu", "cuda",
// "hip") with activations in act and conv weights in weights.
func FootprintFor(backend string, act, weights runtime.DType) FootprintOptions {
	return FootprintOptions{Backend: backend, DType: act, WeightDType: weights}
}
