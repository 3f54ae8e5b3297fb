package nn

import (
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugePageSize is the size of the transparent huge pages the host copies ask for (x86-64 and
// arm64 with 4 KiB base pages: a PMD).
const hugePageSize = 2 << 20

// hostMemory is the anonymous mapping a host copy lives in: the whole mapping (addr, length),
// of which the host copy gets an aligned part.
type hostMemory struct {
	addr   unsafe.Pointer
	length uintptr
	huge   bool // madvise(MADV_HUGEPAGE) was accepted
}

// allocHostMemory maps n bytes (n > 0) of anonymous memory for a host copy: at least 2 MiB
// aligned to 2 MiB and a whole number of 2 MiB pages, advised MADV_HUGEPAGE, so the kernel can
// back it with transparent huge pages when it is set to "madvise" or "always" (first touch
// and cudaHostRegister then handle 512 times fewer pages). A kernel that refuses the advice
// leaves ordinary pages: only slower.
func allocHostMemory(n int) (*hostMemory, []byte, error) {
	if n < hugePageSize {
		length := uintptr(roundUp(n, os.Getpagesize()))
		p, err := unix.MmapPtr(-1, 0, nil, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return nil, nil, fmt.Errorf("map %d bytes of host memory: %w", length, err)
		}
		return &hostMemory{addr: p, length: length}, unsafe.Slice((*byte)(p), n), nil
	}
	// Over-map by one huge page and hand out the aligned part; the unaligned head and tail
	// (one huge page together) stay mapped, never touched, until free unmaps the whole.
	length := uintptr(roundUp(n, hugePageSize))
	p, err := unix.MmapPtr(-1, 0, nil, length+hugePageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, fmt.Errorf("map %d bytes of host memory: %w", length+hugePageSize, err)
	}
	m := &hostMemory{addr: p, length: length + hugePageSize}
	aligned := unsafe.Add(p, uintptr(roundUp(int(uintptr(p)), hugePageSize))-uintptr(p))
	m.huge = unix.Madvise(unsafe.Slice((*byte)(aligned), length), unix.MADV_HUGEPAGE) == nil
	return m, unsafe.Slice((*byte)(aligned), n), nil
}

// free unmaps the whole mapping; every slice of it is invalid afterwards.
func (m *hostMemory) free() error {
	if err := unix.MunmapPtr(m.addr, m.length); err != nil {
		return fmt.Errorf("unmap %d bytes of host memory: %w", m.length, err)
	}
	return nil
}

// TransparentHugePages is the kernel's transparent huge page mode (the bracketed word of
// /sys/kernel/mm/transparent_hugepage/enabled: "always", "madvise" or "never"), or "" when it
// cannot be read. Host copies get huge pages under "always" and "madvise".
func TransparentHugePages() string {
	raw, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil {
		return ""
	}
	s := string(raw)
	i, j := strings.IndexByte(s, '['), strings.IndexByte(s, ']')
	if i < 0 || j < i {
		return strings.TrimSpace(s)
	}
	return s[i+1 : j]
}
