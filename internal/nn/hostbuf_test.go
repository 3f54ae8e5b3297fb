package nn

import "testing"

// TestHostBufferFreeUnpins: a pinned host buffer remembers the runtime that pinned it (a
// second pin changes nothing); free unpins and unmaps it, and a second free does nothing.
func TestHostBufferFreeUnpins(t *testing.T) {
	rt := newRuntime(t)
	b, err := newHostBuffer(hugePageSize + 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.buf) != hugePageSize+1 || b.pinnedIn != nil {
		t.Fatalf("new buffer: %d bytes, pinned in %v; want %d, not pinned", len(b.buf), b.pinnedIn, hugePageSize+1)
	}
	b.buf[len(b.buf)-1] = 1 // the whole buffer is mapped
	for range 2 {
		if err := b.pin(rt); err != nil {
			t.Fatal(err)
		}
		if b.pinnedIn != rt {
			t.Fatalf("after pin: pinned in %v, want the runtime", b.pinnedIn)
		}
	}
	for range 2 {
		if err := b.free(); err != nil {
			t.Fatal(err)
		}
		if b.pinnedIn != nil || b.mem != nil || b.buf != nil {
			t.Fatalf("after free: pinned in %v, memory %v, %d bytes; want nothing left", b.pinnedIn, b.mem, len(b.buf))
		}
	}
}
