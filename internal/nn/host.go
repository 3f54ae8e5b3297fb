package nn

import (
	"fmt"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/framepackd/framepackd/internal/fp8"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// HostSource is a set of tensors kept in host memory exactly as the runtime stores them (the
// dtype after the loader's conversion), in one contiguous buffer: the host copy of a streamed
// block, which a block's device slot is refilled from (Upload of the same dtype is a plain
// copy, so a streamed block computes bit for bit as a resident one). It is a Source, so a
// loader reading it with weight dtype runtime.AsStored uploads every tensor unchanged.
//
// The buffer is allocated once, at its exact size, when EndHost ends the block (binds only
// record where each tensor's bytes come from), and filled by parallel copies: on Linux it is
// anonymous memory advised for transparent huge pages (see allocHostMemory), which Free
// unmaps (unpinning it first where a CopyStream pinned it).
type HostSource struct {
	names   []string // bind order
	infos   map[string]safetensors.TensorInfo
	dtypes  map[string]runtime.DType
	pending [][]byte // BeginHost..EndHost: each tensor's bytes, in bind order
	size    int64    // the bytes recorded so far (the buffer's size once filled)
	buf     []byte   // the filled buffer (nil before EndHost, after Free and when empty)
	mem     *hostBuffer
	allocs  int         // buffer allocations (one for a filled non-empty copy: never regrown)
	freed   bool        // Free ran
	quant   *fp8.Layout // the 8-bit Linear weights it holds, with their scales' names
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
	switch {
	case !ok:
		return nil, fmt.Errorf("host tensor %s: no such tensor", name)
	case h.freed:
		return nil, fmt.Errorf("host tensor %s: the host copy was freed", name)
	case h.pending != nil:
		return nil, fmt.Errorf("host tensor %s: the host copy is not filled yet (EndHost)", name)
	}
	return h.buf[i.Begin:i.End:i.End], nil
}

// DType returns the runtime dtype tensor name is held in.
func (h *HostSource) DType(name string) runtime.DType { return h.dtypes[name] }

// Buffer is the host memory holding every tensor (what a GPU backend pins).
func (h *HostSource) Buffer() []byte { return h.buf }

// NumBytes is the size of the host copy (0 once freed).
func (h *HostSource) NumBytes() int64 { return int64(len(h.buf)) }

// HugePages reports whether the buffer was advised for transparent huge pages (Linux, a
// buffer of 2 MiB or more; whether the kernel backs it with them is its own setting,
// TransparentHugePages).
func (h *HostSource) HugePages() bool { return h.mem != nil && h.mem.mem.huge }

// pin page-locks the host buffer in rt (nothing to pin when it is empty or freed); Free unpins
// it.
func (h *HostSource) pin(rt *runtime.Runtime) error {
	if h.mem == nil {
		return nil
	}
	return h.mem.pin(rt)
}

// Free releases the host buffer (unpinning it where pinned, then unmapping it on Linux); the
// tensors' bytes are gone afterwards. Nothing may still be copying out of it (a BlockStream
// reading it: Release first). A second Free does nothing.
func (h *HostSource) Free() error {
	if h.freed {
		return nil
	}
	h.freed, h.pending, h.buf = true, nil, nil
	if h.mem == nil {
		return nil
	}
	m := h.mem
	h.mem = nil
	return m.free()
}

// record adds tensor name, held as dt, whose bytes are raw (a view into the checkpoint or a
// converted copy, read by fill).
func (h *HostSource) record(name string, dt runtime.DType, shape []int, raw []byte) error {
	sdt, ok := safetensorsDType(dt)
	if !ok {
		return fmt.Errorf("host tensor %s: dtype %s has no host form", name, dt)
	}
	s := make([]int64, len(shape))
	for i, d := range shape {
		s[i] = int64(d)
	}
	begin := h.size
	h.size += int64(len(raw))
	h.pending = append(h.pending, raw)
	h.names = append(h.names, name)
	h.infos[name] = safetensors.TensorInfo{Name: name, DType: sdt, Shape: s, Begin: begin, End: h.size}
	h.dtypes[name] = dt
	return nil
}

// fill allocates the buffer at its final size and copies every recorded tensor into it.
func (h *HostSource) fill() error {
	pending := h.pending
	h.pending = nil
	if h.size == 0 {
		return nil
	}
	mem, err := newHostBuffer(int(h.size))
	if err != nil {
		return err
	}
	h.mem, h.buf = mem, mem.buf
	buf := mem.buf
	h.allocs++
	parts := make([]copyPart, 0, len(pending))
	for i, raw := range pending {
		info := h.infos[h.names[i]]
		parts = append(parts, copyPart{dst: buf[info.Begin:info.End], src: raw})
	}
	copyParallel(parts, goruntime.GOMAXPROCS(0))
	return nil
}

// copyChunk is the largest piece of one tensor a copy goroutine takes at a time: large
// tensors are split so every core copies (one core moves ~0.5 GB/s into fresh memory: page
// faults and zeroing dominate), small ones go whole.
const copyChunk = 4 << 20

// copyPart is one copy of fill: len(dst) == len(src).
type copyPart struct{ dst, src []byte }

// copyParallel copies every part, split into pieces of at most copyChunk bytes shared out
// over up to workers goroutines (one: in the caller's).
func copyParallel(parts []copyPart, workers int) {
	var pieces []copyPart
	var total int
	for _, p := range parts {
		for off := 0; off < len(p.src); off += copyChunk {
			end := min(off+copyChunk, len(p.src))
			pieces = append(pieces, copyPart{dst: p.dst[off:end], src: p.src[off:end]})
		}
		total += len(p.src)
	}
	workers = min(workers, len(pieces), max(1, total/copyChunk))
	if workers <= 1 {
		for _, p := range pieces {
			copy(p.dst, p.src)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(pieces) {
					return
				}
				copy(pieces[i].dst, pieces[i].src)
			}
		})
	}
	wg.Wait()
}

// roundUp is n rounded up to a multiple of m.
func roundUp(n, m int) int { return (n + m - 1) / m * m }

func safetensorsDType(dt runtime.DType) (safetensors.DType, bool) {
	switch dt {
	case runtime.F32:
		return safetensors.F32, true
	case runtime.F16:
		return safetensors.F16, true
	case runtime.BF16:
		return safetensors.BF16, true
	case runtime.F8E4M3:
		return safetensors.F8E4M3, true
	case runtime.F8E5M2:
		return safetensors.F8E5M2, true
	}
	return "", false
}

// BeginHost makes the loader keep the tensors bound from now on in host memory instead of the
// runtime's: each is checked as usual, converted to the dtype it would be uploaded as, and
// stored in the returned HostSource under its name with strip (and the loader's prefix)
// removed; binds return nil until EndHost, which fills the host copy. A tensor whose
// checkpoint dtype is already the target is copied from the checkpoint directly; any other
// goes through the runtime once (one tensor at a time) so the conversion is the runtime's own.
// Shape mode ignores it. The loader frees the host copy if the load fails (Free); once Finish
// succeeds its owner frees it (HostSource.Free).
func (l *Loader) BeginHost(strip string) *HostSource {
	h := &HostSource{infos: map[string]safetensors.TensorInfo{}, dtypes: map[string]runtime.DType{},
		quant: &fp8.Layout{Format: l.FP8Format()}}
	l.host, l.hostStrip = h, l.prefix+strip
	l.hosts = append(l.hosts, h)
	return h
}

// EndHost ends BeginHost: the host copy is allocated at its size and filled, and binds upload
// to the runtime again.
func (l *Loader) EndHost() {
	h, strip := l.host, l.hostStrip
	l.host, l.hostStrip = nil, ""
	if h == nil {
		return
	}
	if len(l.errs) > 0 {
		h.pending = nil // the load fails: nothing to copy
		return
	}
	if err := h.fill(); err != nil {
		l.errs = append(l.errs, fmt.Errorf("host copy of %s: %w", strip, err))
	}
	for _, full := range l.hostViews {
		l.release(full) // copied: the mapping's pages may go
	}
	l.hostViews = l.hostViews[:0]
}

// releaser is a Source whose Bytes are views into a file mapping it can drop from the
// process's resident memory once they are copied (safetensors.Checkpoint.Release).
type releaser interface{ Release(name string) }

// release drops tensor full's mapped pages when the source can (a LoRA-merged source holds
// its tensors in Go memory and cannot).
func (l *Loader) release(full string) {
	if r, ok := l.src.(releaser); ok {
		r.Release(full)
	}
}

// toHost records tensor full (already checked as info, or random: info unused) in the host
// source; EndHost copies its bytes.
func (l *Loader) toHost(full string, dt runtime.DType, shape []int, info safetensors.TensorInfo) {
	name := strings.TrimPrefix(full, l.hostStrip)
	var raw []byte
	var err error
	target := dt
	direct := false
	if l.rng == nil {
		target, direct = storedAs(info, dt)
	}
	if direct {
		raw, err = l.src.Bytes(full) // a view into the checkpoint, open until EndHost
		l.hostViews = append(l.hostViews, full)
	} else {
		var t *runtime.Tensor
		if l.rng != nil {
			t, err = l.random(full, shape, dt)
		} else {
			t, err = l.upload(full, info, dt, shape) // not stored as dt: LoadTensor converts it
		}
		if err == nil {
			raw, err = t.Bytes()
			target = t.DType()
			t.Free()
		}
	}
	if err == nil {
		err = l.host.record(name, target, shape, raw)
	}
	if err != nil {
		l.errs = append(l.errs, fmt.Errorf("tensor %s: host copy: %w", full, err))
		return
	}
	l.hostBytes += int64(len(raw))
}

// HostBytes is the size of every tensor kept in host memory by BeginHost so far.
func (l *Loader) HostBytes() int64 { return l.hostBytes }
