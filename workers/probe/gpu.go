package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/framepackd/framepackd/internal/devices"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// listDevices is devices.List; tests replace it with a fake machine.
var listDevices = devices.List

// probeGPU lists the devices of a GPU backend ("cuda", "hip", or "auto": the first vendor
// with devices) from the drivers (NVML, amdgpu sysfs), and runs the allocation test through
// the backend library when asked. ok is false when auto found no GPU (the caller falls back
// to the cpu).
func (p *probe) probeGPU(ctx context.Context, req *workerkit.ProbeRequest) (resp *workerkit.ProbeResponse, ok bool, err error) {
	devs, err := listDevices(ctx, req.Backend, devices.Options{})
	if err != nil {
		if req.Backend == "auto" && errors.Is(err, devices.ErrNoDevices) {
			return nil, false, nil
		}
		if errors.Is(err, devices.ErrNoDevices) {
			return nil, true, workerkit.Errorf(workerkit.CodeInternal, "probe %s: %v", req.Backend, err)
		}
		return nil, true, fmt.Errorf("probe %s: %w", req.Backend, err)
	}
	backend := devs[0].Backend // auto: the first vendor's devices only (one backend per daemon)
	resp = &workerkit.ProbeResponse{Backend: backend, DriverVersion: devs[0].Driver}
	for _, d := range devs {
		if d.Backend != backend {
			continue
		}
		resp.Devices = append(resp.Devices, workerkit.Device{
			Index: uint32(d.Index), Name: d.Name, Arch: d.Arch, TotalMemoryBytes: d.TotalBytes,
			FreeMemoryBytes: d.FreeBytes(), PCIBusID: d.PCIBusID,
		})
	}
	if req.AllocateBytes > 0 {
		resp.Allocate = p.allocateGPU(backend, req.AllocateBytes, req.AllocateDeviceIndex)
	}
	return resp, true, nil
}

// allocateGPU allocates n bytes on the device through the backend library, writes them and
// frees them (the memory check of a device before a lane uses it).
func (p *probe) allocateGPU(backend string, n uint64, index uint32) *workerkit.AllocateResult {
	start := time.Now()
	fail := func(format string, args ...any) *workerkit.AllocateResult {
		return &workerkit.AllocateResult{Error: fmt.Sprintf(format, args...), Duration: time.Since(start)}
	}
	if n > uint64(^uint(0)>>1) {
		return fail("%d bytes: too large", n)
	}
	p.k.Beacon.BeginOp("probe.allocate")
	defer p.k.Beacon.EndOp()
	rt, err := runtime.New(runtime.Options{Backend: backend, Device: int(index)})
	if err != nil {
		return fail("open %s device %d: %v", backend, index, err)
	}
	defer rt.Close()
	t, err := rt.NewTensor(runtime.U8, int(n))
	if err != nil {
		return fail("allocate %d bytes: %v", n, err)
	}
	p.k.Beacon.SetBytes(int64(n))
	err = t.Fill(1)
	if err == nil {
		err = rt.Synchronize()
	}
	t.Free()
	p.k.Beacon.SetBytes(0)
	if err != nil {
		return fail("write %d bytes: %v", n, err)
	}
	p.mu.Lock()
	p.peak = max(p.peak, n)
	p.mu.Unlock()
	return &workerkit.AllocateResult{Succeeded: true, Duration: time.Since(start)}
}
