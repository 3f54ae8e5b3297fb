package causalvae

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/framepackd/framepackd/internal/runtime"
)

// ErrCheckpoint ("bad checkpoint", the words of internal/nn) is wrapped by every error about a
// checkpoint: a header that does not parse, a missing tensor, a
// wrong shape or dtype, a config that the weights contradict. Retrying cannot help; the
// worker reports it as a bad argument.
var ErrCheckpoint = errors.New("bad checkpoint")

// TensorError names the checkpoint tensor a load problem is about.
type TensorError struct {
	Name    string // checkpoint key ("decoder.conv_in.conv.weight")
	Problem string // "missing", "got shape [..], expected [..]", ...
}

// Error implements error.
func (e *TensorError) Error() string { return "tensor " + e.Name + ": " + e.Problem }

// Unwrap makes errors.Is(err, ErrCheckpoint) hold.
func (e *TensorError) Unwrap() error { return ErrCheckpoint }

// maxLoadErrors is how many tensor problems a load error lists before summarising.
const maxLoadErrors = 8

// binder uploads checkpoint tensors into the runtime, checking names, shapes and dtypes, and
// remembers which keys it used so the rest can be reported as unexpected.
type binder struct {
	rt     *runtime.Runtime
	src    runtime.TensorSource
	dtype  runtime.DType
	wdtype runtime.DType // weight matrices (weight): conv and linear weights
	used   map[string]bool
	owned  []*runtime.Tensor
	bytes  int64
	errs   []error
	// shapes, when set, makes the binder only record the tensors the model asks for.
	shapes map[string][]int
}

func newBinder(rt *runtime.Runtime, src runtime.TensorSource, dt runtime.DType) *binder {
	return &binder{rt: rt, src: src, dtype: dt, wdtype: dt, used: map[string]bool{}}
}

// tensor loads name, which must have shape; after the first problem it only checks the rest.
func (b *binder) tensor(name string, shape ...int) *runtime.Tensor {
	return b.tensorAs(b.dtype, name, shape)
}

// weight is tensor for a conv or linear weight, which the runtime reads in 16 bits: loaded as
// the weight dtype.
func (b *binder) weight(name string, shape ...int) *runtime.Tensor {
	return b.tensorAs(b.wdtype, name, shape)
}

func (b *binder) tensorAs(dt runtime.DType, name string, shape []int) *runtime.Tensor {
	b.used[name] = true
	if b.shapes != nil {
		b.shapes[name] = slices.Clone(shape)
		return nil
	}
	info, ok := b.src.Info(name)
	if !ok {
		b.errs = append(b.errs, &TensorError{Name: name, Problem: fmt.Sprintf("missing from the checkpoint (expected shape %v)", shape)})
		return nil
	}
	got := make([]int, len(info.Shape))
	for i, d := range info.Shape {
		got[i] = int(d)
	}
	if !slices.Equal(got, shape) {
		b.errs = append(b.errs, &TensorError{Name: name, Problem: fmt.Sprintf("got shape %v, expected %v", got, shape)})
		return nil
	}
	if !info.DType.IsFloat() {
		b.errs = append(b.errs, &TensorError{Name: name, Problem: fmt.Sprintf("dtype %s is not a float type", info.DType)})
		return nil
	}
	if len(b.errs) > 0 {
		return nil
	}
	t, err := b.rt.LoadTensor(b.src, name, dt)
	if err != nil {
		if errors.Is(err, runtime.ErrOutOfMemory) {
			b.errs = append(b.errs, fmt.Errorf("tensor %s: %w", name, err))
		} else {
			b.errs = append(b.errs, fmt.Errorf("%w: %w", &TensorError{Name: name, Problem: "unreadable"}, err))
		}
		return nil
	}
	b.owned = append(b.owned, t)
	b.bytes += int64(t.NumBytes())
	return t
}

// TensorShapes returns every checkpoint tensor the model of c needs, with its shape: what a
// checkpoint for c must hold (the supervisor's size estimate, tests' synthetic weights).
func (c Config) TensorShapes() (map[string][]int, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	b := &binder{used: map[string]bool{}, shapes: map[string][]int{}}
	L := c.LatentChannels
	bindEncoder(b, "encoder", c)
	bindDecoder(b, "decoder", c)
	bindConv3d(b, "quant_conv", 2*L, 2*L)
	bindConv3d(b, "post_quant_conv", L, L)
	return b.shapes, nil
}

// err returns the problems found, or nil.
func (b *binder) err() error {
	if len(b.errs) == 0 {
		return nil
	}
	errs := b.errs
	if len(errs) > maxLoadErrors {
		errs = append(slices.Clone(errs[:maxLoadErrors]), fmt.Errorf("and %d more tensor problems", len(b.errs)-maxLoadErrors))
	}
	return errors.Join(errs...)
}

// unexpected lists the checkpoint's keys the model did not use.
func (b *binder) unexpected(names []string) []string {
	var out []string
	for _, n := range names {
		if !b.used[n] {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// free releases everything loaded.
func (b *binder) free() {
	for _, t := range b.owned {
		t.Free()
	}
	b.owned = nil
}

func join(prefix string, parts ...any) string {
	var sb strings.Builder
	sb.WriteString(prefix)
	for _, p := range parts {
		if sb.Len() > 0 {
			sb.WriteByte('.')
		}
		fmt.Fprint(&sb, p)
	}
	return sb.String()
}
