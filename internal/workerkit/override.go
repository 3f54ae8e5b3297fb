package workerkit

import "fmt"

// Override is what one attempt of a stage runs with instead of the lane's and the model's
// defaults: the degradation ladder's settings (supervisor/watchdog) and the attempt's conv
// decision cache and test fault, carried unchanged from the watchdog through the lane
// (ApplyLoad) to the worker's LoadRequest and the stage's request (ApplyStage). Zero fields
// change nothing.
type Override struct {
	// Backend replaces the lane's backend ("cpu": the last rung for small stages); the device
	// index and PCI bus id then no longer apply.
	Backend string
	// MemoryCap lowers the worker's cap (a cap above the stage's is ignored by the lane).
	MemoryCap uint64
	// MaxResidentBlocks caps the blocks of the model's stack kept on the device
	// (ModelTraits.BlockStack; LoadRequest.MaxResidentBlocks).
	MaxResidentBlocks uint32
	// VAETilePx is the spatial tile size, in pixels, of a model that tiles (ModelTraits.Tiles).
	VAETilePx uint32
	// ActivationDType is one of ModelTraits.FallbackDTypes (LoadRequest.ActivationDType).
	ActivationDType string
	// SiglipProcessor is LoadRequest.SiglipProcessor (the daemon's --siglip-processor, which
	// the pipeline sets on its clipvision stage).
	SiglipProcessor string
	// ConvFirstTier makes every convolution start at this tier (ModelTraits.Convolves).
	ConvFirstTier ConvTier
	// ConvCachePath is the conv decision cache the worker reads and the watchdog marks hung
	// shapes in.
	ConvCachePath string
	// Fault is a test fault (nil in production).
	Fault *Fault
}

// String lists the settings that are set ("defaults" when none is), for logs.
func (o Override) String() string {
	s := ""
	add := func(f string, args ...any) {
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf(f, args...)
	}
	if o.VAETilePx != 0 {
		add("vae tile %d px", o.VAETilePx)
	}
	if o.MaxResidentBlocks != 0 {
		add("%d resident blocks", o.MaxResidentBlocks)
	}
	if o.MemoryCap != 0 {
		add("memory cap %d bytes", o.MemoryCap)
	}
	if o.ActivationDType != "" {
		add("activations %s", o.ActivationDType)
	}
	if o.SiglipProcessor != "" {
		add("siglip processor %s", o.SiglipProcessor)
	}
	if o.Backend != "" {
		add("backend %s", o.Backend)
	}
	if o.ConvFirstTier != ConvTierUnspecified {
		add("conv from tier %d", o.ConvFirstTier)
	}
	if s == "" {
		return "defaults"
	}
	return s
}

// Merge returns o with the fields set in over replacing its own: a stage's own override (the
// pipeline's, e.g. its SigLIP processor) under an attempt's (the watchdog's).
func (o Override) Merge(over Override) Override {
	if over.Backend != "" {
		o.Backend = over.Backend
	}
	if over.MemoryCap != 0 {
		o.MemoryCap = over.MemoryCap
	}
	if over.MaxResidentBlocks != 0 {
		o.MaxResidentBlocks = over.MaxResidentBlocks
	}
	if over.VAETilePx != 0 {
		o.VAETilePx = over.VAETilePx
	}
	if over.ActivationDType != "" {
		o.ActivationDType = over.ActivationDType
	}
	if over.SiglipProcessor != "" {
		o.SiglipProcessor = over.SiglipProcessor
	}
	if over.ConvFirstTier != ConvTierUnspecified {
		o.ConvFirstTier = over.ConvFirstTier
	}
	if over.ConvCachePath != "" {
		o.ConvCachePath = over.ConvCachePath
	}
	if over.Fault != nil {
		o.Fault = over.Fault
	}
	return o
}

// ApplyLoad writes the override into req, the lane's LoadRequest for the stage. The memory cap
// is the lane's to settle (it never raises a stage's cap) and is left alone.
func (o Override) ApplyLoad(req *LoadRequest) {
	if o.MaxResidentBlocks != 0 {
		req.MaxResidentBlocks = o.MaxResidentBlocks
	}
	if o.ActivationDType != "" {
		req.ActivationDType = o.ActivationDType
	}
	if o.SiglipProcessor != "" {
		req.SiglipProcessor = o.SiglipProcessor
	}
	if o.Backend != "" && o.Backend != req.Backend {
		req.Backend, req.DeviceIndex, req.PCIBusID = o.Backend, 0, ""
	}
	if o.ConvCachePath != "" || o.ConvFirstTier != ConvTierUnspecified {
		p := ConvPolicy{}
		if req.ConvPolicy != nil {
			p = *req.ConvPolicy
		}
		if o.ConvCachePath != "" {
			p.DecisionCachePath = o.ConvCachePath
		}
		if o.ConvFirstTier != ConvTierUnspecified {
			p.ForcedTier = o.ConvFirstTier
		}
		req.ConvPolicy = &p
	}
	if o.Fault != nil {
		f := *o.Fault
		req.Fault = &f
	}
}

// ApplyStage returns the stage's request with the override's tiling: a VAE request gets
// spatial tiles of VAETilePx pixels with diffusers' 3/4 stride. Other requests, and any request
// when VAETilePx is 0, come back as they are; the request given is never changed.
func (o Override) ApplyStage(req Stage) Stage {
	px := o.VAETilePx
	if px == 0 {
		return req
	}
	tiled := func(base *VAETiling) *VAETiling {
		t := VAETiling{}
		if base != nil {
			t = *base
		}
		t.EnableSpatialTiling = true
		t.TileSampleMinHeight, t.TileSampleMinWidth = px, px
		t.TileSampleStrideHeight, t.TileSampleStrideWidth = px*3/4, px*3/4
		return &t
	}
	switch r := req.(type) {
	case *VAEEncodeRequest:
		c := *r
		c.Tiling = tiled(r.Tiling)
		return &c
	case *VAEDecodeRequest:
		c := *r
		c.Tiling = tiled(r.Tiling)
		return &c
	}
	return req
}
