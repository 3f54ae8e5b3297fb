package dit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// WeightSource is a checkpoint's named tensors: *safetensors.Checkpoint and *safetensors.File.
type WeightSource interface {
	runtime.TensorSource
	Names() []string
}

// binder binds checkpoint tensors to the model's typed fields at load, checking each one's
// shape. It keeps the first error; later calls return nil tensors, so a constructor can bind all
// its fields and check the error once.
type binder struct {
	rt     *runtime.Runtime
	src    WeightSource  // nil in random mode
	rng    *rand.Rand    // random mode
	wdtype runtime.DType // weight matrices (weight); everything else is f32
	err    error
	used   map[string]bool
	all    []*runtime.Tensor
}

// tensor binds name with the given shape as an f32 tensor.
func (b *binder) tensor(name string, shape ...int) *runtime.Tensor {
	return b.bind(runtime.F32, name, shape)
}

// weight binds a weight matrix the runtime reads in 16 bits (a Linear's or a patch
// convolution's weight) as the weight dtype.
func (b *binder) weight(name string, shape ...int) *runtime.Tensor {
	return b.bind(b.wdtype, name, shape)
}

func (b *binder) bind(dt runtime.DType, name string, shape []int) *runtime.Tensor {
	if b.err != nil {
		return nil
	}
	b.used[name] = true
	var t *runtime.Tensor
	var err error
	if b.src == nil {
		t, err = b.random(name, shape, dt)
	} else {
		t, err = b.load(name, shape, dt)
	}
	if err != nil {
		b.err = err
		return nil
	}
	b.all = append(b.all, t)
	return t
}

func (b *binder) load(name string, shape []int, dt runtime.DType) (*runtime.Tensor, error) {
	info, ok := b.src.Info(name)
	if !ok {
		return nil, fmt.Errorf("%w: tensor %s is missing (expected %v)", ErrBadCheckpoint, name, shape)
	}
	got := make([]int, len(info.Shape))
	for i, d := range info.Shape {
		got[i] = int(d)
	}
	if !slices.Equal(got, shape) {
		return nil, fmt.Errorf("%w: tensor %s: got %v, expected %v", ErrBadCheckpoint, name, got, shape)
	}
	switch info.DType {
	case safetensors.F32, safetensors.F16, safetensors.BF16, safetensors.F64:
	default:
		return nil, fmt.Errorf("%w: tensor %s: dtype %s, expected a float type", ErrBadCheckpoint, name, info.DType)
	}
	t, err := b.rt.LoadTensor(b.src, name, dt)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", name, err)
	}
	return t, nil
}

// random makes a weight as PyTorch's default init would in distribution: uniform ±1/√fan_in
// for matrices and convolutions, ones (±0.1) for 1-D norm weights, small biases; stored as dt
// (rounded from f32; AsStored means f32).
func (b *binder) random(name string, shape []int, dt runtime.DType) (*runtime.Tensor, error) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	lo, hi := float32(-0.02), float32(0.02)
	switch {
	case len(shape) >= 2:
		bound := float32(1 / math.Sqrt(float64(n/shape[0])))
		lo, hi = -bound, bound
	case strings.HasSuffix(name, ".weight"):
		lo, hi = 0.9, 1.1
	}
	for i := range v {
		v[i] = lo + (hi-lo)*b.rng.Float32()
	}
	t, err := b.rt.FromFloat32(v, shape...)
	if err != nil {
		return nil, fmt.Errorf("random %s: %w", name, err)
	}
	if dt == runtime.F32 || dt == runtime.AsStored {
		return t, nil
	}
	defer t.Free()
	h, err := b.rt.Cast(t, dt)
	if err != nil {
		return nil, fmt.Errorf("random %s: %w", name, err)
	}
	return h, nil
}

// unexpected lists the source's tensors nothing bound.
func (b *binder) unexpected() []string {
	if b.src == nil {
		return nil
	}
	var out []string
	for _, n := range b.src.Names() {
		if !b.used[n] {
			out = append(out, n)
		}
	}
	return out
}

func (b *binder) free() {
	for _, t := range b.all {
		t.Free()
	}
	b.all = nil
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}
