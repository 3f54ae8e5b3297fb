package causalvae

import (
	"github.com/framepackd/framepackd/internal/nn"
)

// ErrCheckpoint ("bad checkpoint", the words of internal/nn) is wrapped by every error about a
// checkpoint: a header that does not parse, a missing tensor, a
// wrong shape or dtype, a config that the weights contradict. Retrying cannot help; the
// worker reports it as a bad argument.
var ErrCheckpoint = nn.ErrCheckpoint

// TensorError names the checkpoint tensor a load problem is about (the shared loader's).
type TensorError = nn.TensorError

// TensorShapes returns every checkpoint tensor the model of c needs, with its shape: what a
// checkpoint for c must hold (the supervisor's size estimate, tests' synthetic weights).
func (c Config) TensorShapes() (map[string][]int, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	l := nn.NewShapeLoader()
	(&Model{Config: c}).bind(l)
	return l.Shapes(), nil
}
