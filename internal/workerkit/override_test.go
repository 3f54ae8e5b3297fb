package workerkit

import "testing"

// TestOverrideApplyLoad: an attempt's override reaches the worker's LoadRequest: resident
// blocks, activation dtype, conv policy (kept where the request has one), test fault; another
// backend drops the lane's device; the cap is the lane's to settle and is left alone.
func TestOverrideApplyLoad(t *testing.T) {
	base := func() *LoadRequest {
		return &LoadRequest{Backend: "cuda", DeviceIndex: 1, PCIBusID: "0000:65:00.0", MemoryCapBytes: 8 << 30,
			ConvPolicy: &ConvPolicy{TierOverrides: []ConvTierOverride{{ShapeKey: "k", Tier: ConvTierOwnKernel}}}}
	}
	req := base()
	Override{}.ApplyLoad(req)
	if req.MaxResidentBlocks != 0 || req.ActivationDType != "" || req.Backend != "cuda" || req.DeviceIndex != 1 || req.Fault != nil ||
		len(req.ConvPolicy.TierOverrides) != 1 || req.ConvPolicy.ForcedTier != ConvTierUnspecified {
		t.Fatalf("the zero override changed the request: %+v", req)
	}
	fault := &Fault{OOMAtOp: 3}
	o := Override{Backend: "cpu", MemoryCap: 1 << 30, MaxResidentBlocks: 7, ActivationDType: "bf16", SiglipProcessor: "pil",
		ConvFirstTier: ConvTierVendorDefault, ConvCachePath: "/var/cache/conv.json", Fault: fault}
	req = base()
	o.ApplyLoad(req)
	if req.Backend != "cpu" || req.DeviceIndex != 0 || req.PCIBusID != "" || req.MaxResidentBlocks != 7 || req.ActivationDType != "bf16" ||
		req.SiglipProcessor != "pil" || req.MemoryCapBytes != 8<<30 {
		t.Errorf("request %+v", req)
	}
	if p := req.ConvPolicy; p.ForcedTier != ConvTierVendorDefault || p.DecisionCachePath != "/var/cache/conv.json" || len(p.TierOverrides) != 1 {
		t.Errorf("conv policy %+v", p)
	}
	if req.Fault == nil || req.Fault == fault || *req.Fault != *fault {
		t.Errorf("fault %+v: want a copy of the override's", req.Fault)
	}
	if o.String() != "7 resident blocks, memory cap 1073741824 bytes, activations bf16, siglip processor pil, backend cpu, conv from tier 2" ||
		(Override{}).String() != "defaults" {
		t.Errorf("String %q", o.String())
	}
}

// TestOverrideApplyStage: a tile size tiles a VAE request with diffusers' 3/4 stride, keeping
// its temporal tiling; the stage's own request is never edited; other stages pass through.
func TestOverrideApplyStage(t *testing.T) {
	req := &VAEDecodeRequest{Tiling: &VAETiling{TileSampleMinNumFrames: 16}}
	if got := (Override{}).ApplyStage(req); got != req {
		t.Fatal("no tile size changed the request")
	}
	got := Override{VAETilePx: 128}.ApplyStage(req).(*VAEDecodeRequest)
	tl := got.Tiling
	if !tl.EnableSpatialTiling || tl.TileSampleMinWidth != 128 || tl.TileSampleStrideHeight != 96 || tl.TileSampleMinNumFrames != 16 {
		t.Errorf("tiling %+v", tl)
	}
	if req.Tiling.EnableSpatialTiling {
		t.Error("the stage's own request was edited")
	}
	enc := Override{VAETilePx: 64}.ApplyStage(&VAEEncodeRequest{}).(*VAEEncodeRequest)
	if enc.Tiling == nil || enc.Tiling.TileSampleMinHeight != 64 || enc.Tiling.TileSampleStrideWidth != 48 {
		t.Errorf("encode tiling %+v", enc.Tiling)
	}
	te := &TextEncodeRequest{}
	if got := (Override{VAETilePx: 64}).ApplyStage(te); got != te {
		t.Error("a text request was changed")
	}
}

// TestOverrideMerge: an attempt's override goes over the stage's own: what it sets wins, what it
// leaves unset (the stage's SigLIP processor) stays.
func TestOverrideMerge(t *testing.T) {
	stage := Override{SiglipProcessor: "pil", MaxResidentBlocks: 9}
	f := &Fault{HangAtOp: 2}
	got := stage.Merge(Override{MaxResidentBlocks: 4, Backend: "cpu", ConvCachePath: "/c", Fault: f, VAETilePx: 128,
		ActivationDType: "bf16", MemoryCap: 5, ConvFirstTier: ConvTierCPU})
	want := Override{SiglipProcessor: "pil", MaxResidentBlocks: 4, Backend: "cpu", ConvCachePath: "/c", Fault: f, VAETilePx: 128,
		ActivationDType: "bf16", MemoryCap: 5, ConvFirstTier: ConvTierCPU}
	if got != want {
		t.Fatalf("merged %+v, want %+v", got, want)
	}
	if got := stage.Merge(Override{}); got != stage {
		t.Errorf("merging nothing changed %+v into %+v", stage, got)
	}
}
