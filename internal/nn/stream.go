package nn

import (
	"fmt"

	"github.com/framepackd/framepackd/internal/runtime"
)

// streamSlot is one device copy of a block of kind T that streamed blocks are copied into.
type streamSlot[T any] struct {
	blk     T
	tensors []*runtime.Tensor // in the host copies' order
	index   int               // the block it holds
	// ready is recorded on the copy stream after a refill (compute waits for it before it
	// reads the slot: pending says it has not yet); done on the compute stream after the
	// block computed (the next refill waits for it).
	ready, done *runtime.Event
	pending     bool
}

// BlockStream streams the non-resident blocks of one kind (a model's stack of repeated
// blocks, T the block's typed module) through at most two device slots, one block ahead of
// compute: while block i computes in one slot the next streamed block is copied into the
// other, on the copy stream (SetCopyStream) and ordered by events. A block's host copy comes
// from Loader.BeginHost. Slots are made on first use and freed by Release (end of a forward).
// The caller, per block: Use before computing it, Prefetch after Use, Computed once its
// compute is queued.
type BlockStream[T any] struct {
	rt       *runtime.Runtime
	name     string              // "transformer_blocks"
	bind     func(l *Loader) T   // binds one block, prefix ""
	host     map[int]*HostSource // streamed block → its host copy
	order    []int               // streamed blocks, ascending
	slots    []*streamSlot[T]
	next     int   // the slot the next fill reuses (the one filled longest ago)
	copied   int64 // bytes copied into slots so far
	maxSlots int
	copy     *runtime.Stream // refills run on it (nil: the runtime's own stream)
}

// NewBlockStream returns an empty stream for blocks named name.N, bind binding one block of
// the kind with prefix "" (the names its host copies hold).
func NewBlockStream[T any](rt *runtime.Runtime, name string, bind func(l *Loader) T) *BlockStream[T] {
	return &BlockStream[T]{rt: rt, name: name, bind: bind, host: map[int]*HostSource{}}
}

// BindBlocks binds the n blocks name.0 … name.(n-1) with bind: the first resident into the
// runtime, the rest into host copies added to s (which only they touch: nil when none stream).
func BindBlocks[T any](l *Loader, s *BlockStream[T], name string, n, resident int, bind func(l *Loader, name string) T) []T {
	var out []T
	for i := range n {
		prefix := Join(name, i)
		if i < resident {
			out = append(out, bind(l, prefix))
			continue
		}
		h := l.BeginHost(prefix + ".")
		out = append(out, bind(l, prefix))
		l.EndHost()
		s.Add(i, h)
	}
	return out
}

// SetCopyStream makes refills run on st (nil: the runtime's own stream).
func (s *BlockStream[T]) SetCopyStream(st *runtime.Stream) { s.copy = st }

// CopiedBytes is how many bytes have been copied into slots so far.
func (s *BlockStream[T]) CopiedBytes() int64 { return s.copied }

// Add makes block i streamed from its host copy h.
func (s *BlockStream[T]) Add(i int, h *HostSource) {
	s.host[i] = h
	s.order = append(s.order, i)
	s.maxSlots = min(2, len(s.order))
}

// Streamed reports whether block i is streamed.
func (s *BlockStream[T]) Streamed(i int) bool {
	_, ok := s.host[i]
	return ok
}

// fetch returns streamed block i with its weights in a slot, copying them there unless a
// prefetch already did.
func (s *BlockStream[T]) fetch(i int) (T, error) {
	var zero T
	for _, sl := range s.slots {
		if sl.index == i {
			return sl.blk, nil
		}
	}
	h, ok := s.host[i]
	if !ok {
		return zero, fmt.Errorf("%s.%d is not streamed", s.name, i)
	}
	if len(s.slots) < s.maxSlots {
		l := NewLoader(s.rt, h, Options{DType: runtime.AsStored, WeightDType: runtime.AsStored}, "") // every tensor as its host copy holds it
		blk := s.bind(l)
		ts, _, err := l.Finish()
		if err != nil {
			return zero, fmt.Errorf("%s.%d: make a streaming slot: %w", s.name, i, err)
		}
		sl := &streamSlot[T]{blk: blk, tensors: ts.tensors, index: i}
		if sl.ready, err = s.rt.NewEvent(); err == nil {
			sl.done, err = s.rt.NewEvent()
		}
		if err != nil {
			sl.free()
			return zero, fmt.Errorf("%s.%d: make a streaming slot: %w", s.name, i, err)
		}
		s.slots = append(s.slots, sl)
		s.next = len(s.slots) % s.maxSlots
		s.copied += h.NumBytes()
		return blk, nil
	}
	sl := s.slots[s.next]
	names := h.Names()
	if len(names) != len(sl.tensors) {
		return zero, fmt.Errorf("%s.%d: %d host tensors for a slot of %d", s.name, i, len(names), len(sl.tensors))
	}
	sl.index = -1
	// The copy stream waits until compute is done with the slot's last block, copies the
	// host bytes (already in the slot's dtypes: a plain copy) and marks the slot ready.
	if err := sl.done.Wait(s.copy); err != nil {
		return zero, fmt.Errorf("%s.%d: %w", s.name, i, err)
	}
	for j, t := range sl.tensors {
		raw, err := h.Bytes(names[j])
		if err == nil && h.DType(names[j]) != t.DType() {
			err = fmt.Errorf("host copy is %s, the slot %s", h.DType(names[j]), t.DType())
		}
		if err == nil {
			err = t.UploadAsync(s.copy, raw)
		}
		if err != nil {
			return zero, fmt.Errorf("%s.%d: copy %s into its slot: %w", s.name, i, names[j], err)
		}
	}
	if err := sl.ready.Record(s.copy); err != nil {
		return zero, fmt.Errorf("%s.%d: %w", s.name, i, err)
	}
	sl.index, sl.pending = i, true
	s.next = (s.next + 1) % len(s.slots)
	s.copied += h.NumBytes()
	return sl.blk, nil
}

// Use returns streamed block i for compute: fetched (a prefetch usually did it) and, when its
// copy is still in flight, with the compute stream ordered after it.
func (s *BlockStream[T]) Use(i int) (T, error) {
	blk, err := s.fetch(i)
	if err != nil {
		return blk, err
	}
	for _, sl := range s.slots {
		if sl.index == i && sl.pending {
			if err := sl.ready.Wait(nil); err != nil {
				return blk, fmt.Errorf("%s.%d: %w", s.name, i, err)
			}
			sl.pending = false
		}
	}
	return blk, nil
}

// Computed marks block i's compute as queued: its slot may be refilled once the compute
// stream passes this point.
func (s *BlockStream[T]) Computed(i int) error {
	for _, sl := range s.slots {
		if sl.index == i {
			if err := sl.done.Record(nil); err != nil {
				return fmt.Errorf("%s.%d: %w", s.name, i, err)
			}
		}
	}
	return nil
}

// Prefetch copies the streamed block after i into the other slot, so it is there when block
// i is done. With one slot there is nowhere to put it without evicting block i.
func (s *BlockStream[T]) Prefetch(i int) error {
	if s.maxSlots < 2 {
		return nil
	}
	for _, j := range s.order {
		if j > i {
			_, err := s.fetch(j)
			return err
		}
	}
	return nil
}

// Release frees the slots once no copy into them is in flight.
func (s *BlockStream[T]) Release() {
	if len(s.slots) > 0 && s.copy != nil {
		_ = s.copy.Synchronize() // a failed device fails the next op anyway
	}
	for _, sl := range s.slots {
		sl.free()
	}
	s.slots, s.next = nil, 0
}

func (sl *streamSlot[T]) free() {
	for _, t := range sl.tensors {
		t.Free()
	}
	sl.ready.Free()
	sl.done.Free()
}

// FreeHost frees the streamed blocks' host copies (unpinning them where a CopyStream pinned
// them, then unmapping them on Linux): the last step of freeing a model, after Release (no
// copy out of them in flight). A second call does nothing.
func (s *BlockStream[T]) FreeHost() {
	for _, i := range s.order {
		_ = s.host[i].Free() // an unmap cannot fail for a mapping of ours; nothing to do if it did
	}
}

// HostBytes is the size of the streamed blocks' host copies.
func (s *BlockStream[T]) HostBytes() int64 {
	var n int64
	for _, h := range s.host {
		n += h.NumBytes()
	}
	return n
}

// hostCopies are the streamed blocks' host copies, ascending (what NewCopyStream pins).
func (s *BlockStream[T]) hostCopies() []*HostSource {
	out := make([]*HostSource, 0, len(s.order))
	for _, i := range s.order {
		out = append(out, s.host[i])
	}
	return out
}

// NumElements is the number of weight elements in the host copies.
func (s *BlockStream[T]) NumElements() int64 {
	var n int64
	for _, h := range s.host {
		for _, name := range h.Names() {
			info, _ := h.Info(name)
			n += info.NumElements()
		}
	}
	return n
}

// CopyStream is what the BlockStreams of one model share for their refills: one copy stream.
// Making it pins their host copies, which their FreeHost unpins. Free it after the
// BlockStreams' Release (which waits for the copies on it).
type CopyStream struct {
	st *runtime.Stream
}

// NewCopyStream makes the copy stream the refills of ss run on and pins their host copies
// (pinning only speeds the copies up: a backend that cannot pin copies from pageable memory).
func NewCopyStream(rt *runtime.Runtime, ss ...interface {
	SetCopyStream(*runtime.Stream)
	hostCopies() []*HostSource
}) (*CopyStream, error) {
	st, err := rt.NewStream()
	if err != nil {
		return nil, err
	}
	for _, s := range ss {
		s.SetCopyStream(st)
	}
	for _, s := range ss {
		for _, h := range s.hostCopies() {
			_ = h.pin(rt) // pageable on failure: only slower
		}
	}
	return &CopyStream{st: st}, nil
}

// Free frees the copy stream (nil: nothing to free).
func (c *CopyStream) Free() {
	if c == nil {
		return
	}
	c.st.Free()
	c.st = nil
}
