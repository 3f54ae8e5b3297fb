package main

import (
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// Until block streaming exists every block of the transformer stays on the device, so a worker
// whose memory cap cannot hold the weights would only fail with out-of-memory after reading
// gigabytes, and every retry would read them again. Load refuses it first, from the
// checkpoint's header alone, with an error the watchdog never retries (invalid argument).

// weightEstimate is the device memory the checkpoint's weights take when loaded with weight
// dtype wdt: matrices (rank ≥ 2) in wdt (or their stored dtype for AsStored), vectors (biases,
// norms) in float32. It is a lower bound of the worker's need: activations come on top.
func weightEstimate(dir string, wdt runtime.DType) (uint64, error) {
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		return 0, err
	}
	defer ck.Close()
	var total uint64
	for _, name := range ck.Names() {
		info, ok := ck.Info(name)
		if !ok {
			continue
		}
		n := uint64(info.NumElements())
		size := uint64(info.DType.Size())
		switch {
		case !info.DType.IsFloat():
		case len(info.Shape) < 2 || size > 4:
			size = 4 // vectors stay float32; f64 becomes f32
		case wdt != runtime.AsStored:
			size = uint64(wdt.Size())
		}
		total += n * size
	}
	return total, nil
}

// checkFits refuses a load whose weights alone exceed the memory cap (0: no cap), and a
// max_resident_blocks that asks for block streaming.
func checkFits(req *workerkit.LoadRequest, wdt runtime.DType) error {
	if req.MaxResidentBlocks != 0 {
		return workerkit.InvalidArgumentf("load: max_resident_blocks %d: block streaming is not implemented yet, every block stays resident (leave it 0)", req.MaxResidentBlocks)
	}
	if req.MemoryCapBytes == 0 {
		return nil
	}
	need, err := weightEstimate(req.ModelDir, wdt)
	if err != nil {
		return nil // an unreadable checkpoint: the load itself says what is wrong with it
	}
	if need > req.MemoryCapBytes {
		return workerkit.InvalidArgumentf("load %s: the transformer's weights need %.2f GiB on the device, more than the worker's memory cap of %.2f GiB; "+
			"block streaming is not implemented yet, so it cannot run here: lower the job's gpu_memory_preservation_gb, load 16-bit weights, or use a device with more memory",
			req.ModelDir, float64(need)/(1<<30), float64(req.MemoryCapBytes)/(1<<30))
	}
	return nil
}
