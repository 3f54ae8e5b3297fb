package nn

import (
	"fmt"
	"slices"
	"strings"

	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// HostSource is a set of tensors kept in host memory exactly as the runtime stores them (the
// dtype after the loader's conversion), in one contiguous buffer: the host copy of a streamed
// block, which a block's device slot is refilled from (Upload of the same dtype is a plain
// copy, so a streamed block computes bit for bit as a resident one). It is a Source, so a
// loader reading it with weight dtype runtime.AsStored uploads every tensor unchanged.
type HostSource struct {
	names  []string // bind order
	infos  map[string]safetensors.TensorInfo
	dtypes map[string]runtime.DType
	buf    []byte
}

// Names returns the tensors in the order they were bound.
func (h *HostSource) Names() []string { return slices.Clone(h.names) }

// Info implements runtime.TensorSource.
func (h *HostSource) Info(name string) (safetensors.TensorInfo, bool) {
	i, ok := h.infos[name]
	return i, ok
}

// Bytes implements runtime.TensorSource: a view into the host buffer.
func (h *HostSource) Bytes(name string) ([]byte, error) {
	i, ok := h.infos[name]
	if !ok {
		return nil, fmt.Errorf("host tensor %s: no such tensor", name)
	}
	return h.buf[i.Begin:i.End:i.End], nil
}

// DType returns the runtime dtype tensor name is held in.
func (h *HostSource) DType(name string) runtime.DType { return h.dtypes[name] }

// Buffer is the host memory holding every tensor (what a GPU backend pins).
func (h *HostSource) Buffer() []byte { return h.buf }

// NumBytes is the size of the host copy.
func (h *HostSource) NumBytes() int64 { return int64(len(h.buf)) }

func (h *HostSource) add(name string, dt runtime.DType, shape []int, raw []byte) error {
	sdt, ok := safetensorsDType(dt)
	if !ok {
		return fmt.Errorf("host tensor %s: dtype %s has no host form", name, dt)
	}
	s := make([]int64, len(shape))
	for i, d := range shape {
		s[i] = int64(d)
	}
	begin := int64(len(h.buf))
	h.buf = append(h.buf, raw...)
	h.names = append(h.names, name)
	h.infos[name] = safetensors.TensorInfo{Name: name, DType: sdt, Shape: s, Begin: begin, End: int64(len(h.buf))}
	h.dtypes[name] = dt
	return nil
}

func safetensorsDType(dt runtime.DType) (safetensors.DType, bool) {
	switch dt {
	case runtime.F32:
		return safetensors.F32, true
	case runtime.F16:
		return safetensors.F16, true
	case runtime.BF16:
		return safetensors.BF16, true
	}
	return "", false
}

// BeginHost makes the loader keep the tensors bound from now on in host memory instead of the
// runtime's: each is checked as usual, converted to the dtype it would be uploaded as, and
// stored in the returned HostSource under its name with strip (and the loader's prefix)
// removed; binds return nil until EndHost. A tensor whose checkpoint dtype is already the
// target is copied from the checkpoint directly; any other goes through the runtime once (one
// tensor at a time) so the conversion is the runtime's own. Shape mode ignores it.
func (l *Loader) BeginHost(strip string) *HostSource {
	h := &HostSource{infos: map[string]safetensors.TensorInfo{}, dtypes: map[string]runtime.DType{}}
	l.host, l.hostStrip = h, l.prefix+strip
	return h
}

// EndHost ends BeginHost: binds upload to the runtime again.
func (l *Loader) EndHost() { l.host, l.hostStrip = nil, "" }

// toHost stores tensor full (already checked, or random) in the host source.
func (l *Loader) toHost(full string, dt runtime.DType, shape []int) {
	name := strings.TrimPrefix(full, l.hostStrip)
	var raw []byte
	var err error
	target := dt
	if l.rng == nil {
		info, _ := l.src.Info(full)
		if dt == runtime.AsStored {
			target = runtime.StoredDType(info.DType)
		}
		if sdt, ok := runtime.DTypeOf(info.DType); ok && sdt == target {
			raw, err = l.src.Bytes(full) // copied by add
			if err == nil {
				err = l.host.add(name, target, shape, raw)
			}
			l.hostDone(full, err)
			return
		}
	}
	var t *runtime.Tensor
	if l.rng != nil {
		t, err = l.random(full, shape, dt)
	} else {
		t, err = l.rt.LoadTensor(l.src, full, dt)
	}
	if err == nil {
		raw, err = t.Bytes()
		target = t.DType()
		t.Free()
	}
	if err == nil {
		err = l.host.add(name, target, shape, raw)
	}
	l.hostDone(full, err)
}

func (l *Loader) hostDone(full string, err error) {
	if err != nil {
		l.errs = append(l.errs, fmt.Errorf("tensor %s: host copy: %w", full, err))
		return
	}
	l.hostBytes += int64(l.host.infos[strings.TrimPrefix(full, l.hostStrip)].End - l.host.infos[strings.TrimPrefix(full, l.hostStrip)].Begin)
}

// HostBytes is the size of every tensor kept in host memory by BeginHost so far.
func (l *Loader) HostBytes() int64 { return l.hostBytes }
