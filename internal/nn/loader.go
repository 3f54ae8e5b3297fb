// Package nn holds the pieces the model packages of the workers share (textenc's CLIP and
// Llama, clipvision's SigLIP): a checkpoint loader that checks names, shapes and dtypes both
// ways, torch.nn's Linear and LayerNorm, activations by their transformers names, and an
// embedding table that stays in the mapped checkpoint.
package nn

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// ErrBadInput is wrapped by forward errors caused by the caller's input (a token id outside
// the vocabulary, a sequence longer than the model's positions); workers map it to
// InvalidArgument.
var ErrBadInput = errors.New("bad input")

// ErrCheckpoint is wrapped by load errors about the checkpoint's tensors (missing, wrong shape,
// not a float type).
var ErrCheckpoint = errors.New("bad checkpoint")

// Source is a set of named tensors: *safetensors.Checkpoint.
type Source interface {
	runtime.TensorSource
	Names() []string
}

// Loader binds checkpoint tensors to runtime tensors. Every tensor it hands out is tracked so
// that a failed load frees what it already uploaded (Free) and a finished load can report the
// checkpoint tensors nobody asked for (Report).
type Loader struct {
	rt     *runtime.Runtime
	src    Source
	dtype  runtime.DType
	wdtype runtime.DType // weight matrices (LoadWeight)
	prefix string

	used    map[string]bool
	skipped map[string]bool
	loaded  []*runtime.Tensor
	bytes   int64
}

// NewLoader returns a loader that uploads tensors of src into rt as dtype dt. prefix is put in
// front of every name asked for ("model." for a LlamaForCausalLM checkpoint, "" for LlamaModel).
// Weight matrices (LoadWeight) are uploaded as dt too unless SetWeightDType says otherwise.
func NewLoader(rt *runtime.Runtime, src Source, dt runtime.DType, prefix string) *Loader {
	return &Loader{rt: rt, src: src, dtype: dt, wdtype: dt, prefix: prefix, used: map[string]bool{}, skipped: map[string]bool{}}
}

// SetWeightDType sets the dtype of the weight matrices that LoadWeight uploads
// (those the runtime's Linear and EmbeddingAs read in 16 bits): F16, BF16, runtime.AsStored
// (the checkpoint's own dtype) or the loader's dtype.
func (l *Loader) SetWeightDType(dt runtime.DType) { l.wdtype = dt }

// DetectPrefix returns the first of prefixes under which src holds name ("" included if
// listed), so one loader serves checkpoints saved with or without a wrapper module.
func DetectPrefix(src runtime.TensorSource, name string, prefixes ...string) (string, error) {
	for _, p := range prefixes {
		if _, ok := src.Info(p + name); ok {
			return p, nil
		}
	}
	if len(prefixes) == 0 {
		return "", fmt.Errorf("%w: tensor %q is missing", ErrCheckpoint, name)
	}
	quoted := make([]string, len(prefixes)-1)
	for i, p := range prefixes[1:] {
		quoted[i] = fmt.Sprintf("%q", p)
	}
	return "", fmt.Errorf("%w: tensor %q is missing (also looked under %s)", ErrCheckpoint, prefixes[0]+name, strings.Join(quoted, ", "))
}

// Prefix returns the prefix the loader puts in front of names.
func (l *Loader) Prefix() string { return l.prefix }

// DType returns the dtype tensors are uploaded as.
func (l *Loader) DType() runtime.DType { return l.dtype }

func shapeOf(info safetensors.TensorInfo) []int {
	s := make([]int, len(info.Shape))
	for i, d := range info.Shape {
		s[i] = int(d)
	}
	return s
}

// info looks name up and checks its shape against shape and that it is a float type the
// runtime stores.
func (l *Loader) info(name string, shape []int) (runtime.DType, error) {
	full := l.prefix + name
	info, ok := l.src.Info(full)
	if !ok {
		return 0, fmt.Errorf("%w: tensor %q is missing", ErrCheckpoint, full)
	}
	if got := shapeOf(info); !slices.Equal(got, shape) {
		return 0, fmt.Errorf("%w: tensor %q: got %v, expected %v", ErrCheckpoint, full, got, shape)
	}
	dt, ok := runtime.DTypeOf(info.DType)
	if !ok || !dt.IsFloat() {
		return 0, fmt.Errorf("%w: tensor %q: dtype %s is not a float type the runtime stores", ErrCheckpoint, full, info.DType)
	}
	l.used[full] = true
	return dt, nil
}

// Load uploads tensor name (prefix added), which must have exactly shape.
func (l *Loader) Load(name string, shape ...int) (*runtime.Tensor, error) {
	return l.load(l.dtype, name, shape)
}

// LoadWeight is Load for a weight matrix the runtime may read in 16 bits (a Linear's or a
// convolution's weight, an embedding table): uploaded as the weight dtype (SetWeightDType).
func (l *Loader) LoadWeight(name string, shape ...int) (*runtime.Tensor, error) {
	return l.load(l.wdtype, name, shape)
}

func (l *Loader) load(dt runtime.DType, name string, shape []int) (*runtime.Tensor, error) {
	if _, err := l.info(name, shape); err != nil {
		return nil, err
	}
	t, err := l.rt.LoadTensor(l.src, l.prefix+name, dt)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", l.prefix+name, err)
	}
	l.track(t)
	return t, nil
}

// Raw returns the stored bytes of tensor name (a view into the mapped checkpoint) and their
// dtype, for tensors the caller uses on the host (HostEmbedding gathers rows from it).
func (l *Loader) Raw(name string, shape ...int) (runtime.DType, []byte, error) {
	dt, err := l.info(name, shape)
	if err != nil {
		return 0, nil, err
	}
	raw, err := l.src.Bytes(l.prefix + name)
	if err != nil {
		return 0, nil, fmt.Errorf("load %s: %w", l.prefix+name, err)
	}
	return dt, raw, nil
}

func (l *Loader) track(t *runtime.Tensor) {
	l.loaded = append(l.loaded, t)
	l.bytes += int64(t.NumBytes())
}

// Skip marks checkpoint tensors whose names start with prefix (loader prefix added) as known
// but deliberately not loaded (layers a forward pass never reaches).
func (l *Loader) Skip(prefix string) { l.SkipRoot(l.prefix + prefix) }

// SkipRoot is Skip without the loader's prefix, for tensors outside the wrapped module (a
// causal LM's lm_head next to its "model." body).
func (l *Loader) SkipRoot(prefix string) {
	for _, n := range l.src.Names() {
		if strings.HasPrefix(n, prefix) && !l.used[n] {
			l.skipped[n] = true
		}
	}
}

// Tensors returns every tensor uploaded so far (the caller owns them once loading succeeded).
func (l *Loader) Tensors() []*runtime.Tensor { return slices.Clone(l.loaded) }

// Free frees every tensor uploaded so far (after a failed load).
func (l *Loader) Free() {
	for _, t := range l.loaded {
		t.Free()
	}
	l.loaded = nil
	l.bytes = 0
}

// Report says what a load did with the checkpoint's tensors.
type Report struct {
	// Prefix is the name prefix the checkpoint uses ("" or a wrapper module's, "vision_model.").
	Prefix string
	// Loaded is the number of checkpoint tensors bound to the model.
	Loaded int
	// Bytes is the size of the uploaded weights in the runtime's memory.
	Bytes int64
	// Skipped lists tensors deliberately left in the checkpoint (never computed).
	Skipped []string
	// Unexpected lists tensors the model does not know (neither loaded nor skipped).
	Unexpected []string
}

// Report returns what has been loaded, skipped and left over so far.
func (l *Loader) Report() Report {
	r := Report{Prefix: l.prefix, Loaded: len(l.used), Bytes: l.bytes}
	for _, n := range l.src.Names() {
		switch {
		case l.used[n]:
		case l.skipped[n]:
			r.Skipped = append(r.Skipped, n)
		default:
			r.Unexpected = append(r.Unexpected, n)
		}
	}
	sort.Strings(r.Skipped)
	sort.Strings(r.Unexpected)
	return r
}
