package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/framepackd/framepackd/internal/devices"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// TestProbeGPU: the probe worker reports what the drivers list (one vendor per daemon), falls
// back to the cpu under auto when no GPU is there, and refuses an explicit GPU backend without
// devices.
func TestProbeGPU(t *testing.T) {
	saved := listDevices
	t.Cleanup(func() { listDevices = saved })
	machine := []devices.Device{
		{Backend: "hip", Index: 0, Name: "AMD Radeon RX 7900 XTX", Arch: "gfx1100", PCIBusID: "0000:03:00.0",
			TotalBytes: 24 << 30, UsedBytes: 1 << 30, Driver: "amdgpu 6.8.5"},
		{Backend: "hip", Index: 1, Name: "AMD Radeon 8060S", Arch: "gfx1151", PCIBusID: "0000:c5:00.0",
			TotalBytes: 96 << 30, UsedBytes: 2 << 30, Unified: true},
	}
	listDevices = func(_ context.Context, backend string, _ devices.Options) ([]devices.Device, error) {
		if backend == "cuda" {
			return nil, fmt.Errorf("nvml: %w", devices.ErrNoDevices)
		}
		return machine, nil
	}
	p := newProbe(&workerkit.Kit{Name: "probe"})
	resp, err := p.Probe(t.Context(), &workerkit.ProbeRequest{Backend: "auto"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Backend != "hip" || len(resp.Devices) != 2 || resp.DriverVersion != "amdgpu 6.8.5" {
		t.Fatalf("probe %+v", resp)
	}
	d := resp.Devices[1]
	if d.Index != 1 || d.Arch != "gfx1151" || d.PCIBusID != "0000:c5:00.0" || d.TotalMemoryBytes != 96<<30 ||
		d.FreeMemoryBytes != 94<<30 {
		t.Fatalf("device 1: %+v", d)
	}
	if _, err := p.Probe(t.Context(), &workerkit.ProbeRequest{Backend: "cuda"}); workerkit.CodeOf(err) != workerkit.CodeInternal {
		t.Fatalf("cuda without devices: %v", err)
	}

	listDevices = func(context.Context, string, devices.Options) ([]devices.Device, error) {
		return nil, fmt.Errorf("list: %w", devices.ErrNoDevices)
	}
	resp, err = p.Probe(t.Context(), &workerkit.ProbeRequest{Backend: "auto"})
	if err != nil || resp.Backend != "cpu" {
		t.Fatalf("auto without a GPU: %+v, %v", resp, err)
	}
}
