package devices

import (
	"fmt"

	gpudevices "github.com/framepackd/framepackd/internal/devices"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// Reader reads the bytes in use on one device now (internal/devices' reader, named for logs).
type Reader = gpudevices.Reader

// MemoryReader returns the used-memory reader of a GPU lane's device, dev as the probe found
// it; nil on a cpu lane.
//
// Devices are read through two deliberate paths and no third:
//   - what devices exist (name, arch, total memory, PCI bus id) comes from the probe worker
//     (Prober), in a throwaway process: initialising a vendor runtime may crash, and a crash
//     there must not take the daemon down (ARCHITECTURE.md §6);
//   - the used-memory figure the VRAM recovery check polls every 250 ms comes from
//     internal/devices in the daemon's process, by the bus id the probe reported: NVML's
//     nvmlDeviceGetHandleByPciBusId_v2 on cuda, amdgpu's sysfs files on hip. Reading a figure
//     creates no context and loads no kernel code onto the device, so it cannot crash the way
//     vendor initialisation can, and spawning a process four times a second would cost more
//     than the figure. By bus id, the lane reads the GPU its workers run on even on a host
//     whose GPUs the runtime and the driver number differently.
//
// A GPU device without a bus id is a configuration error, not a reason to guess by index.
func MemoryReader(lane Lane, dev *framepackv1.Device) (Reader, error) {
	if !lane.GPU() {
		return nil, nil
	}
	bus := dev.GetPciBusId()
	if bus == "" {
		return nil, fmt.Errorf("lane %s: the probe reported no PCI bus id for this device, so its memory cannot be watched (is the lane's device present?)", lane)
	}
	r, err := gpudevices.NewReader(gpudevices.Device{Backend: lane.Backend, PCIBusID: bus}, gpudevices.Options{})
	if err != nil {
		return nil, fmt.Errorf("lane %s: %w", lane, err)
	}
	return namedReader{r, fmt.Sprintf("%s %s", lane.Backend, bus)}, nil
}

// namedReader gives an internal/devices reader the name the watchdog logs.
type namedReader struct {
	gpudevices.Reader
	name string
}

// Name says where the figure comes from.
func (r namedReader) Name() string { return r.name }
