package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/shirou/gopsutil/v3/mem"
	"golang.org/x/sys/unix"

	"github.com/framepackd/framepackd/internal/workerkit"
)

// probe is the probe worker. It loads no model: Load and Run are refused.
type probe struct {
	k *workerkit.Kit

	mu   sync.Mutex // mu protects peak
	peak uint64     // largest successful allocation test
}

var _ workerkit.Worker = (*probe)(nil)

func newProbe(k *workerkit.Kit) *probe { return &probe{k: k} }

// Load is refused: the probe worker has no model.
func (p *probe) Load(context.Context, *workerkit.LoadRequest) (*workerkit.LoadResponse, error) {
	return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "probe worker: load: there is no model to load")
}

// Run is refused: the probe worker runs no stage.
func (p *probe) Run(context.Context, *workerkit.RunRequest, workerkit.Emit) (*workerkit.Result, error) {
	return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "probe worker: run: there is no stage to run")
}

// Stats reports the process's resident memory and the largest allocation test.
func (p *probe) Stats(context.Context) (*workerkit.Stats, error) {
	p.mu.Lock()
	peak := p.peak
	p.mu.Unlock()
	rss, err := workerkit.HostRSS()
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	return &workerkit.Stats{HostRSSBytes: rss, AllocatorPeakBytes: peak}, nil
}

// Probe lists the devices of the requested backend and runs the allocation test if asked.
func (p *probe) Probe(ctx context.Context, req *workerkit.ProbeRequest) (*workerkit.ProbeResponse, error) {
	for k, v := range req.Env {
		if err := os.Setenv(k, v); err != nil {
			return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "probe: set %s: %v", k, err)
		}
	}
	switch req.Backend {
	case "", "cpu":
	case "auto", "cuda", "hip":
		if resp, ok, err := p.probeGPU(ctx, req); ok || err != nil {
			if err == nil {
				err = runtimeVersions(resp.Backend, resp)
			}
			return resp, err
		}
	default:
		return nil, workerkit.Errorf(workerkit.CodeInternal, "probe: backend %q is not available in this build", req.Backend)
	}
	dev, err := cpuDevice()
	if err != nil {
		return nil, fmt.Errorf("probe cpu: %w", err)
	}
	resp := &workerkit.ProbeResponse{Backend: "cpu", DriverVersion: kernelVersion(), Devices: []workerkit.Device{dev}}
	if req.AllocateBytes > 0 {
		resp.Allocate = p.allocate(ctx, req.AllocateBytes, req.AllocateDeviceIndex, dev)
	}
	if err := runtimeVersions("cpu", resp); err != nil {
		return nil, err
	}
	return resp, nil
}

// allocate maps n bytes of fresh memory outside the Go heap, writes every page and unmaps it.
func (p *probe) allocate(ctx context.Context, n uint64, index uint32, dev workerkit.Device) *workerkit.AllocateResult {
	start := time.Now()
	fail := func(format string, args ...any) *workerkit.AllocateResult {
		return &workerkit.AllocateResult{Error: fmt.Sprintf(format, args...), Duration: time.Since(start)}
	}
	if index != dev.Index {
		return fail("no cpu device %d", index)
	}
	if n > dev.TotalMemoryBytes || n > uint64(^uint(0)>>1) {
		return fail("%d bytes exceed the device's %d", n, dev.TotalMemoryBytes)
	}
	p.k.Beacon.BeginOp("probe.allocate")
	defer p.k.Beacon.EndOp()
	b, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fail("allocate %d bytes: %v", n, err)
	}
	p.k.Beacon.SetBytes(int64(n))
	page := os.Getpagesize()
	for i := 0; i < len(b); i += page {
		b[i] = byte(i)
		if i%(1<<30) == 0 && ctx.Err() != nil {
			break
		}
	}
	cerr := ctx.Err()
	err = unix.Munmap(b)
	p.k.Beacon.SetBytes(0)
	switch {
	case cerr != nil:
		return fail("allocate %d bytes: %v", n, cerr)
	case err != nil:
		return fail("free %d bytes: %v", n, err)
	}
	p.mu.Lock()
	p.peak = max(p.peak, n)
	p.mu.Unlock()
	return &workerkit.AllocateResult{Succeeded: true, Duration: time.Since(start)}
}

// cpuDevice describes the host CPU as device 0.
func cpuDevice() (workerkit.Device, error) {
	vm, err := mem.VirtualMemory()
	if err != nil {
		return workerkit.Device{}, fmt.Errorf("memory: %w", err)
	}
	name := "cpu"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		name = cpuName(f, name)
		f.Close()
	}
	return workerkit.Device{
		Index:            0,
		Name:             name,
		Arch:             workerkit.HostArch(),
		TotalMemoryBytes: vm.Total,
		FreeMemoryBytes:  vm.Available,
	}, nil
}

// cpuName returns the CPU's name from /proc/cpuinfo text: "model name" on x86, "Hardware" or
// "Model" on some ARM kernels; def when neither is there.
func cpuName(r io.Reader, def string) string {
	var fallback string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case v == "":
		case k == "model name":
			return v
		case (k == "Hardware" || k == "Model") && fallback == "":
			fallback = v
		}
	}
	if fallback != "" {
		return fallback
	}
	return def
}

// kernelVersion returns "linux <release>".
func kernelVersion() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "linux"
	}
	return "linux " + unix.ByteSliceToString(u.Release[:])
}
