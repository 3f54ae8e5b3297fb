package nn

import (
	"errors"
	"fmt"
	goruntime "runtime"
	"strconv"

	"github.com/framepackd/framepackd/internal/envconfig"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// Staged upload of resident weights (docs/DECISIONS.md, "Staged upload of resident weights").
//
// Without it a resident tensor is uploaded by LoadTensor: one synchronous copy from the
// checkpoint's pageable mapping per tensor, which a GPU driver stages itself through a small
// pinned buffer on one thread (4–6 GB/s measured on an H100). With it a tensor whose checkpoint
// dtype is already the dtype it is uploaded as goes through a ring of pinned host slots: the
// bytes are copied from the mapping into a slot by every core (copyParallel), the device
// tensor is allocated and the slot's bytes queued to it with UploadAsync on a copy stream, and
// the slot's event recorded; the next tensors fill the other slots meanwhile, and a slot is
// refilled only once the host has waited its event. Small tensors are packed into one slot
// one after another. Any other tensor (a conversion, or one larger than a slot) keeps the
// LoadTensor path.

// EnvStagedUpload switches staged upload of resident weights for every checkpoint loader:
// anything strconv.ParseBool reads as true turns it on, as false turns it off. Unset (or
// unreadable) it is on for a device backend (its tensors are not host memory: measured on an
// H200, the transformer's load went from ~3.7 s to ~2.1 s and the text encoder's from 2.6 s to
// 1.4 s) and off for the cpu backend, where a tensor's "upload" is one host copy already and
// the slots would only add host memory.
var EnvStagedUpload = envconfig.StagedUpload.Name

// EnvStagedUploadSlotBytes sets the size of each staging slot in bytes (default
// DefaultStagingSlotBytes; tests use a few hundred bytes so tensors are larger than a slot).
var EnvStagedUploadSlotBytes = envconfig.StagedUploadSlotBytes.Name

const (
	// DefaultStagingSlots is how many slots the ring has: the host fills one or two while
	// the device copies out of another.
	DefaultStagingSlots = 3
	// DefaultStagingSlotBytes is the size of one slot: 128 MiB holds the largest resident
	// tensor of every full-size model (a single block's proj_out of the transformer, 90 MiB in
	// bf16; a Llama 3 8B MLP matrix, 112 MiB in fp16), so none falls back to LoadTensor.
	DefaultStagingSlotBytes = 128 << 20
	// stagingAlign is where each tensor packed into a slot starts (a multiple of it).
	stagingAlign = 256
)

// errStaging is wrapped by failures of the staging ring itself (its host memory, pinning, the
// copy stream and events): not a checkpoint problem.
var errStaging = errors.New("staged upload")

// Staging configures staged upload on a loader (SetStaging). The zero value turns it off.
type Staging struct {
	// Slots is the number of pinned host slots in the ring (0: staging off).
	Slots int
	// SlotBytes is the size of each slot; a tensor larger than it is uploaded by LoadTensor.
	SlotBytes int
}

// StagingFromEnv is the staging EnvStagedUpload and EnvStagedUploadSlotBytes ask for on a
// backend whose tensors are host memory (hostTensors) or not: the variable's value when it
// reads as a bool, else on for a device backend and off for a host one.
func StagingFromEnv(hostTensors bool) Staging {
	on, err := strconv.ParseBool(envconfig.StagedUpload.Get())
	if err != nil {
		on = !hostTensors
	}
	if !on {
		return Staging{}
	}
	s := Staging{Slots: DefaultStagingSlots, SlotBytes: DefaultStagingSlotBytes}
	if n, err := strconv.Atoi(envconfig.StagedUploadSlotBytes.Get()); err == nil && n > 0 {
		s.SlotBytes = n
	}
	return s
}

// SetStaging turns staged upload on (s.Slots > 0 and s.SlotBytes > 0) or off for the binds
// that follow. NewLoader sets StagingFromEnv; a source already in host memory (a HostSource)
// is never staged. The ring is made at the first tensor staged and freed by Finish or Free
// (which wait for every queued copy first), or here when s changes it (after its copies).
func (l *Loader) SetStaging(s Staging) {
	if s.Slots <= 0 || s.SlotBytes <= 0 {
		s = Staging{}
	}
	if s != l.staging {
		l.closeRing()
	}
	l.staging = s
}

// StagedBytes is how many bytes have been uploaded through the staging ring so far.
func (l *Loader) StagedBytes() int64 { return l.stagedBytes }

// stageable reports whether the tensor info describes, uploaded as dt, goes through the
// staging ring, and returns its runtime dtype and size in bytes.
func (l *Loader) stageable(info safetensors.TensorInfo, dt runtime.DType) (runtime.DType, int, bool) {
	if l.staging.Slots == 0 {
		return 0, 0, false
	}
	if _, ok := l.src.(*HostSource); ok {
		return 0, 0, false
	}
	sdt, ok := storedAs(info, dt)
	if !ok {
		return 0, 0, false
	}
	n := info.NumElements() * int64(sdt.Size())
	return sdt, int(n), n > 0 && n <= int64(l.staging.SlotBytes)
}

// stagingSlot is one slot of the ring: a piece of the pinned buffer and the event recorded
// after the last copy queued out of it.
type stagingSlot struct {
	buf      []byte
	copied   *runtime.Event
	inFlight bool // copied was recorded since the host last waited for it
}

// stagingRing is the pinned host buffer, its slots, the copy stream and the event that orders
// the copy stream after the runtime's own.
type stagingRing struct {
	rt      *runtime.Runtime
	host    *hostBuffer // every slot, pinned
	slots   []stagingSlot
	cur     int // the slot being filled
	off     int // where the next tensor goes in it
	copy    *runtime.Stream
	compute *runtime.Event // recorded on the runtime's stream before each upload
	workers int
}

// newStagingRing allocates, pins and sets up the ring of s; on failure it frees what it made.
func newStagingRing(rt *runtime.Runtime, s Staging) (r *stagingRing, err error) {
	r = &stagingRing{rt: rt, workers: goruntime.GOMAXPROCS(0)}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.close())
			r = nil
		}
	}()
	slotBytes := roundUp(s.SlotBytes, stagingAlign)
	if r.host, err = newHostBuffer(slotBytes * s.Slots); err != nil {
		return r, err
	}
	if err = r.host.pin(rt); err != nil {
		return r, err
	}
	if r.copy, err = rt.NewStream(); err != nil {
		return r, err
	}
	if r.compute, err = rt.NewEvent(); err != nil {
		return r, err
	}
	for i := range s.Slots {
		ev, err := rt.NewEvent()
		if err != nil {
			return r, err
		}
		r.slots = append(r.slots, stagingSlot{buf: r.host.buf[i*slotBytes : (i+1)*slotBytes : (i+1)*slotBytes], copied: ev})
	}
	return r, nil
}

// upload makes a tensor of dt and shape holding raw (already in dt), through the ring. The
// tensor may be read by work queued on the runtime's own stream from now on (that stream
// waits for the copy); the host must not read it before the ring is closed.
func (r *stagingRing) upload(dt runtime.DType, shape []int, raw []byte) (*runtime.Tensor, error) {
	n := len(raw)
	if r.off+n > len(r.slots[r.cur].buf) {
		r.cur, r.off = (r.cur+1)%len(r.slots), 0
	}
	sl := &r.slots[r.cur]
	if r.off == 0 && sl.inFlight {
		// Every copy out of this slot must be done before the host overwrites it.
		if err := sl.copied.Synchronize(); err != nil {
			return nil, fmt.Errorf("%w: wait for slot %d: %w", errStaging, r.cur, err)
		}
		sl.inFlight = false
	}
	staged := sl.buf[r.off : r.off+n : r.off+n]
	copyParallel([]copyPart{{dst: staged, src: raw}}, r.workers)
	t, err := r.rt.NewTensor(dt, shape...)
	if err != nil {
		return nil, err
	}
	// The device memory may have been freed by work still queued on the runtime's stream
	// (the allocator's cache knows no streams): the copy waits for that work.
	err = r.compute.Record(nil)
	if err == nil {
		err = r.compute.Wait(r.copy)
	}
	if err == nil {
		err = t.UploadAsync(r.copy, staged)
	}
	if err != nil {
		t.Free()
		return nil, fmt.Errorf("%w: queue the copy: %w", errStaging, err)
	}
	// Whatever the runtime's stream runs from now on (an op a model runs while loading, the
	// next LoadTensor) sees the tensor's bytes.
	err = sl.copied.Record(r.copy)
	sl.inFlight = sl.inFlight || err == nil
	if err == nil {
		err = sl.copied.Wait(nil)
	}
	if err != nil {
		// The upload was queued: the tensor may be freed only once the copy stream is idle.
		err = errors.Join(err, r.copy.Synchronize())
		t.Free()
		return nil, fmt.Errorf("%w: order the copy: %w", errStaging, err)
	}
	r.off = roundUp(r.off+n, stagingAlign)
	return t, nil
}

// close waits for every queued copy, then frees the events, the stream and the pinned buffer;
// it returns the first problem (the copies' included) and may be called on a half-made ring.
func (r *stagingRing) close() error {
	var errs []error
	if r.copy != nil {
		if err := r.copy.Synchronize(); err != nil {
			errs = append(errs, fmt.Errorf("%w: wait for the copies: %w", errStaging, err))
		}
		r.copy.Free()
		r.copy = nil
	}
	for i := range r.slots {
		r.slots[i].copied.Free()
	}
	r.slots = nil
	r.compute.Free()
	r.compute = nil
	if r.host != nil {
		if err := r.host.free(); err != nil {
			errs = append(errs, fmt.Errorf("%w: the ring: %w", errStaging, err))
		}
		r.host = nil
	}
	return errors.Join(errs...)
}

// loadStaged uploads tensor full of dtype dt, n bytes, through the ring (made on first use).
func (l *Loader) loadStaged(full string, dt runtime.DType, shape []int, n int) (*runtime.Tensor, error) {
	raw, err := l.src.Bytes(full)
	if err != nil {
		return nil, err
	}
	if len(raw) != n {
		return nil, fmt.Errorf("%d bytes for %v of %s (want %d)", len(raw), shape, dt, n)
	}
	if l.ring == nil {
		if l.ring, err = newStagingRing(l.rt, l.staging); err != nil {
			return nil, fmt.Errorf("%w: make the ring of %d × %d bytes: %w", errStaging, l.staging.Slots, l.staging.SlotBytes, err)
		}
	}
	t, err := l.ring.upload(dt, shape, raw)
	if err != nil {
		return nil, err
	}
	l.stagedBytes += int64(len(raw))
	l.release(full) // in the slot now: the mapping's pages may go
	return t, nil
}

// closeRing waits for the ring's copies and frees it (nothing without one); a problem is
// recorded as a load error.
func (l *Loader) closeRing() {
	if l.ring == nil {
		return
	}
	r := l.ring
	l.ring = nil
	if err := r.close(); err != nil {
		l.errs = append(l.errs, err)
	}
}

func numElements(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}
