package siglip

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// checkpointPrefixes are the names a SiglipVisionModel's tensors may sit under: transformers 5
// saves them bare ("embeddings.…"), transformers 4 and the FLUX Redux checkpoint under the
// vision_model wrapper ("vision_model.embeddings.…").
var checkpointPrefixes = []string{"", "vision_model."}

// Source is a set of named tensors to load a model from: *safetensors.Checkpoint.
type Source interface {
	runtime.TensorSource
	Names() []string
}

// loader binds checkpoint tensors to runtime tensors, checking names and shapes, and keeps what
// it uploaded so a failed load can free it and a finished one can report leftovers.
type loader struct {
	rt     *runtime.Runtime
	src    Source
	dtype  runtime.DType
	wdtype runtime.DType // weight matrices (loadWeight)
	prefix string

	used    map[string]bool
	skipped map[string]bool
	loaded  []*runtime.Tensor
	bytes   int64
}

func newLoader(rt *runtime.Runtime, src Source, dt runtime.DType) (*loader, error) {
	l := &loader{rt: rt, src: src, dtype: dt, wdtype: dt, used: map[string]bool{}, skipped: map[string]bool{}}
	const probe = "embeddings.patch_embedding.weight"
	for _, p := range checkpointPrefixes {
		if _, ok := src.Info(p + probe); ok {
			l.prefix = p
			return l, nil
		}
	}
	return nil, fmt.Errorf("%w: tensor %q is missing (also looked under %q)", ErrCheckpoint, probe, "vision_model.")
}

// load uploads tensor name (prefix added), which must have exactly shape.
func (l *loader) load(name string, shape ...int) (*runtime.Tensor, error) {
	return l.loadAs(l.dtype, name, shape...)
}

// loadWeight is load for a weight matrix the runtime reads in 16 bits (a Linear's or the patch
// convolution's weight): uploaded as the weight dtype.
func (l *loader) loadWeight(name string, shape ...int) (*runtime.Tensor, error) {
	return l.loadAs(l.wdtype, name, shape...)
}

func (l *loader) loadAs(dt runtime.DType, name string, shape ...int) (*runtime.Tensor, error) {
	full := l.prefix + name
	info, ok := l.src.Info(full)
	if !ok {
		return nil, fmt.Errorf("%w: tensor %q is missing", ErrCheckpoint, full)
	}
	got := make([]int, len(info.Shape))
	for i, d := range info.Shape {
		got[i] = int(d)
	}
	if !slices.Equal(got, shape) {
		return nil, fmt.Errorf("%w: tensor %q: got %v, expected %v", ErrCheckpoint, full, got, shape)
	}
	if !info.DType.IsFloat() {
		return nil, fmt.Errorf("%w: tensor %q: dtype %s is not a float type", ErrCheckpoint, full, info.DType)
	}
	t, err := l.rt.LoadTensor(l.src, full, dt)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", full, err)
	}
	l.used[full] = true
	l.loaded = append(l.loaded, t)
	l.bytes += int64(t.NumBytes())
	return t, nil
}

// skip marks the tensors under prefix (loader prefix added) as known but not loaded.
func (l *loader) skip(prefix string) {
	for _, n := range l.src.Names() {
		if strings.HasPrefix(n, l.prefix+prefix) && !l.used[n] {
			l.skipped[n] = true
		}
	}
}

func (l *loader) free() {
	for _, t := range l.loaded {
		t.Free()
	}
	l.loaded = nil
	l.bytes = 0
}

// LoadReport says what Load did with the checkpoint's tensors; the worker logs it.
type LoadReport struct {
	// Prefix is the name prefix the checkpoint uses ("" or "vision_model.").
	Prefix string
	// Loaded is the number of checkpoint tensors bound to the model.
	Loaded int
	// Bytes is the size of the uploaded weights in the runtime's memory.
	Bytes int64
	// Skipped lists tensors deliberately left in the checkpoint: the pooling head ("head.…"),
	// whose output FramePack does not use.
	Skipped []string
	// Unexpected lists tensors the model does not know.
	Unexpected []string
}

func (l *loader) report() LoadReport {
	r := LoadReport{Prefix: l.prefix, Loaded: len(l.used), Bytes: l.bytes}
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

var _ Source = (*safetensors.Checkpoint)(nil)
