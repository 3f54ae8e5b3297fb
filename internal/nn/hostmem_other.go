//go:build !linux

package nn

// hugePageSize is the alignment tests expect of a large host copy (none off Linux).
const hugePageSize = 1

// hostMemory is the Go heap allocation a host copy lives in off Linux (no huge page advice
// to give): the garbage collector frees it once the host copy drops it.
type hostMemory struct{ huge bool }

// allocHostMemory allocates n bytes on the Go heap, at their exact size.
func allocHostMemory(n int) (*hostMemory, []byte, error) {
	return &hostMemory{}, make([]byte, n), nil
}

// free drops nothing itself: the host copy's reference was the last one.
func (m *hostMemory) free() error { return nil }

// TransparentHugePages is "" off Linux: no transparent huge pages.
func TransparentHugePages() string { return "" }
