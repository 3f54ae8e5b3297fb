package nn

import (
	"errors"
	"fmt"

	"github.com/framepackd/framepackd/internal/runtime"
)

// hostBuffer is host memory from allocHostMemory that a runtime may pin (page-lock), so that
// copies out of it run asynchronously at DMA speed. free unpins it before it unmaps it: a GPU
// driver must not be left with a registration of memory that is gone.
type hostBuffer struct {
	mem      *hostMemory
	buf      []byte
	pinnedIn *runtime.Runtime // the runtime that pinned buf (nil: not pinned)
}

// newHostBuffer allocates n bytes (n > 0), not pinned.
func newHostBuffer(n int) (*hostBuffer, error) {
	mem, buf, err := allocHostMemory(n)
	if err != nil {
		return nil, err
	}
	return &hostBuffer{mem: mem, buf: buf}, nil
}

// pin page-locks the buffer in rt; free unpins it. A buffer already pinned stays as it is.
func (b *hostBuffer) pin(rt *runtime.Runtime) error {
	if b.pinnedIn != nil {
		return nil
	}
	if err := rt.PinHost(b.buf); err != nil {
		return fmt.Errorf("pin %d bytes of host memory: %w", len(b.buf), err)
	}
	b.pinnedIn = rt
	return nil
}

// free unpins the buffer where it is pinned, then unmaps it (also when the unpin failed) and
// returns both problems; every slice of it is invalid afterwards. A second free does nothing.
func (b *hostBuffer) free() error {
	if b.mem == nil {
		return nil
	}
	var errs []error
	if b.pinnedIn != nil {
		if err := b.pinnedIn.UnpinHost(b.buf); err != nil {
			errs = append(errs, fmt.Errorf("unpin %d bytes of host memory: %w", len(b.buf), err))
		}
		b.pinnedIn = nil
	}
	if err := b.mem.free(); err != nil {
		errs = append(errs, err)
	}
	b.mem, b.buf = nil, nil
	return errors.Join(errs...)
}
