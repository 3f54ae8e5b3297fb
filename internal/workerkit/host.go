package workerkit

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// HostRSS returns the process's resident set size, from /proc/self/statm (Stats.HostRSSBytes).
func HostRSS() (uint64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, err
	}
	var size, rss uint64
	if _, err := fmt.Sscan(string(b), &size, &rss); err != nil {
		return 0, fmt.Errorf("parse statm: %w", err)
	}
	return rss * uint64(os.Getpagesize()), nil
}

// HostArch returns the machine's architecture as the kernel names it ("x86_64", "aarch64"), or
// GOARCH: Device.Arch of the host.
func HostArch() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		if m := unix.ByteSliceToString(u.Machine[:]); m != "" {
			return m
		}
	}
	return runtime.GOARCH
}
