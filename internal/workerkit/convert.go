package workerkit

// Field copies between the Go types and the generated proto types, nothing else. to* functions
// go Go → proto, from* functions proto → Go; nil maps to the zero value and back.

import (
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/framepackd/framepackd/internal/safetensors"
	pb "github.com/framepackd/framepackd/proto/gen/go/framepack/worker/v1"
)

func toDuration(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

func fromDuration(d *durationpb.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.AsDuration()
}

func toTensorRef(t TensorRef) *pb.TensorRef {
	if t.Path == "" && t.Name == "" && t.DType == "" && t.Shape == nil {
		return nil
	}
	return &pb.TensorRef{Path: t.Path, Name: t.Name, Dtype: string(t.DType), Shape: t.Shape}
}

func fromTensorRef(t *pb.TensorRef) TensorRef {
	if t == nil {
		return TensorRef{}
	}
	return TensorRef{Path: t.GetPath(), Name: t.GetName(), DType: safetensors.DType(t.GetDtype()), Shape: t.GetShape()}
}

func toTensorRefs(ts []TensorRef) []*pb.TensorRef {
	if ts == nil {
		return nil
	}
	out := make([]*pb.TensorRef, len(ts))
	for i, t := range ts {
		out[i] = &pb.TensorRef{Path: t.Path, Name: t.Name, Dtype: string(t.DType), Shape: t.Shape}
	}
	return out
}

func fromTensorRefs(ts []*pb.TensorRef) []TensorRef {
	if ts == nil {
		return nil
	}
	out := make([]TensorRef, len(ts))
	for i, t := range ts {
		out[i] = fromTensorRef(t)
	}
	return out
}

func toConvPolicy(p *ConvPolicy) *pb.ConvPolicy {
	if p == nil {
		return nil
	}
	out := &pb.ConvPolicy{ForcedTier: pb.ConvTier(p.ForcedTier), DecisionCachePath: p.DecisionCachePath}
	for _, o := range p.TierOverrides {
		out.TierOverrides = append(out.TierOverrides, &pb.ConvTierOverride{ShapeKey: o.ShapeKey, Tier: pb.ConvTier(o.Tier)})
	}
	return out
}

func fromConvPolicy(p *pb.ConvPolicy) *ConvPolicy {
	if p == nil {
		return nil
	}
	out := &ConvPolicy{ForcedTier: ConvTier(p.GetForcedTier()), DecisionCachePath: p.GetDecisionCachePath()}
	for _, o := range p.GetTierOverrides() {
		out.TierOverrides = append(out.TierOverrides, ConvTierOverride{ShapeKey: o.GetShapeKey(), Tier: ConvTier(o.GetTier())})
	}
	return out
}

func toFault(f *Fault) *pb.Fault {
	if f == nil {
		return nil
	}
	return &pb.Fault{
		ExitAtOp: f.ExitAtOp, ExitSignal: f.ExitSignal, HangAtOp: f.HangAtOp, OomAtOp: f.OOMAtOp,
		HangConvShapeKey: f.HangConvShapeKey, HangConvTier: pb.ConvTier(f.HangConvTier),
		HoldVramBytes: f.HoldVRAMBytes, HoldVramSeconds: f.HoldVRAMSeconds, OomAtLoad: f.OOMAtLoad,
	}
}

func fromFault(f *pb.Fault) *Fault {
	if f == nil {
		return nil
	}
	return &Fault{
		ExitAtOp: f.GetExitAtOp(), ExitSignal: f.GetExitSignal(), HangAtOp: f.GetHangAtOp(), OOMAtOp: f.GetOomAtOp(),
		HangConvShapeKey: f.GetHangConvShapeKey(), HangConvTier: ConvTier(f.GetHangConvTier()),
		HoldVRAMBytes: f.GetHoldVramBytes(), HoldVRAMSeconds: f.GetHoldVramSeconds(), OOMAtLoad: f.GetOomAtLoad(),
	}
}

func toLoadRequest(r *LoadRequest) *pb.LoadRequest {
	return &pb.LoadRequest{
		ModelDir: r.ModelDir, Dtype: r.DType, Backend: r.Backend, DeviceIndex: r.DeviceIndex,
		MemoryCapBytes: r.MemoryCapBytes, ConvPolicy: toConvPolicy(r.ConvPolicy), Env: r.Env,
		BeaconPath: r.BeaconPath, MaxResidentBlocks: r.MaxResidentBlocks, Fault: toFault(r.Fault), PciBusId: r.PCIBusID,
		Loras: toLoraSpecs(r.Loras), Workload: toWorkload(r.Workload), ActivationDtype: r.ActivationDType,
		SiglipProcessor: r.SiglipProcessor,
		Checkpoint:      r.Checkpoint, Weights: r.Weights, Fp8Compute: r.FP8Compute,
	}
}

func toWorkload(w *Workload) *pb.Workload {
	if w == nil {
		return nil
	}
	return &pb.Workload{Height: w.Height, Width: w.Width, LatentWindowSize: w.LatentWindowSize, ReserveBytes: w.ReserveBytes}
}

func fromWorkload(w *pb.Workload) *Workload {
	if w == nil {
		return nil
	}
	return &Workload{Height: w.GetHeight(), Width: w.GetWidth(), LatentWindowSize: w.GetLatentWindowSize(), ReserveBytes: w.GetReserveBytes()}
}

func toExtraPrompts(ps []ExtraPrompt) []*pb.ExtraPrompt {
	var out []*pb.ExtraPrompt
	for _, p := range ps {
		out = append(out, &pb.ExtraPrompt{Prompt: p.Prompt, LlamaVec: toTensorRef(p.LlamaVec), LlamaMask: toTensorRef(p.LlamaMask),
			ClipPooler: toTensorRef(p.ClipPooler)})
	}
	return out
}

func fromExtraPrompts(ps []*pb.ExtraPrompt) []ExtraPrompt {
	var out []ExtraPrompt
	for _, p := range ps {
		out = append(out, ExtraPrompt{Prompt: p.GetPrompt(), LlamaVec: fromTensorRef(p.GetLlamaVec()), LlamaMask: fromTensorRef(p.GetLlamaMask()),
			ClipPooler: fromTensorRef(p.GetClipPooler())})
	}
	return out
}

func toLoraSpecs(ls []LoraSpec) []*pb.LoraSpec {
	var out []*pb.LoraSpec
	for _, l := range ls {
		out = append(out, &pb.LoraSpec{Path: l.Path, Strength: l.Strength})
	}
	return out
}

func fromLoraSpecs(ls []*pb.LoraSpec) []LoraSpec {
	var out []LoraSpec
	for _, l := range ls {
		out = append(out, LoraSpec{Path: l.GetPath(), Strength: l.GetStrength()})
	}
	return out
}

func toLorasApplied(ls []LoraApplied) []*pb.LoraApplied {
	var out []*pb.LoraApplied
	for _, l := range ls {
		out = append(out, &pb.LoraApplied{Path: l.Path, Strength: l.Strength, Format: l.Format, WeightsChanged: l.WeightsChanged})
	}
	return out
}

func fromLorasApplied(ls []*pb.LoraApplied) []LoraApplied {
	var out []LoraApplied
	for _, l := range ls {
		out = append(out, LoraApplied{Path: l.GetPath(), Strength: l.GetStrength(), Format: l.GetFormat(), WeightsChanged: l.GetWeightsChanged()})
	}
	return out
}

func fromLoadRequest(r *pb.LoadRequest) *LoadRequest {
	return &LoadRequest{
		ModelDir: r.GetModelDir(), DType: r.GetDtype(), Backend: r.GetBackend(), DeviceIndex: r.GetDeviceIndex(),
		MemoryCapBytes: r.GetMemoryCapBytes(), ConvPolicy: fromConvPolicy(r.GetConvPolicy()), Env: r.GetEnv(),
		BeaconPath: r.GetBeaconPath(), MaxResidentBlocks: r.GetMaxResidentBlocks(), Fault: fromFault(r.GetFault()), PCIBusID: r.GetPciBusId(),
		Loras: fromLoraSpecs(r.GetLoras()), Workload: fromWorkload(r.GetWorkload()), ActivationDType: r.GetActivationDtype(),
		SiglipProcessor: r.GetSiglipProcessor(),
		Checkpoint:      r.GetCheckpoint(), Weights: r.GetWeights(), FP8Compute: r.GetFp8Compute(),
	}
}

func toDevice(d Device) *pb.Device {
	return &pb.Device{
		Index: d.Index, Name: d.Name, Arch: d.Arch, TotalMemoryBytes: d.TotalMemoryBytes,
		FreeMemoryBytes: d.FreeMemoryBytes, PciBusId: d.PCIBusID,
	}
}

func fromDevice(d *pb.Device) Device {
	return Device{
		Index: d.GetIndex(), Name: d.GetName(), Arch: d.GetArch(), TotalMemoryBytes: d.GetTotalMemoryBytes(),
		FreeMemoryBytes: d.GetFreeMemoryBytes(), PCIBusID: d.GetPciBusId(),
	}
}

func toLoadResponse(r *LoadResponse) *pb.LoadResponse {
	out := &pb.LoadResponse{
		Backend: r.Backend, Dtype: r.DType, WeightBytes: r.WeightBytes,
		DeviceAllocatedBytes: r.DeviceAllocatedBytes, LoadDuration: toDuration(r.LoadDuration),
		Vae: toVAEInfo(r.VAE), Transformer: toTransformerInfo(r.Transformer), TextEncoder: toTextEncoderInfo(r.TextEncoder),
		ResidentBlocks: r.ResidentBlocks, StreamedBlocks: r.StreamedBlocks, WeightsFormat: r.WeightsFormat, Fp8Compute: r.FP8Compute, Traits: toModelTraits(r.Traits),
	}
	if r.Device != nil {
		out.Device = toDevice(*r.Device)
	}
	if len(r.Loras) > 0 {
		if out.Transformer == nil {
			out.Transformer = &pb.TransformerInfo{}
		}
		out.Transformer.Loras = toLorasApplied(r.Loras)
	}
	return out
}

func fromLoadResponse(r *pb.LoadResponse) *LoadResponse {
	out := &LoadResponse{
		Backend: r.GetBackend(), DType: r.GetDtype(), WeightBytes: r.GetWeightBytes(),
		DeviceAllocatedBytes: r.GetDeviceAllocatedBytes(), LoadDuration: fromDuration(r.GetLoadDuration()),
		VAE: fromVAEInfo(r.GetVae()), Transformer: fromTransformerInfo(r.GetTransformer()), TextEncoder: fromTextEncoderInfo(r.GetTextEncoder()),
		ResidentBlocks: r.GetResidentBlocks(), StreamedBlocks: r.GetStreamedBlocks(), WeightsFormat: r.GetWeightsFormat(), FP8Compute: r.GetFp8Compute(),
		Traits: fromModelTraits(r.GetTraits()),
	}
	if r.GetDevice() != nil {
		d := fromDevice(r.GetDevice())
		out.Device = &d
	}
	out.Loras = fromLorasApplied(r.GetTransformer().GetLoras())
	return out
}

func toModelTraits(t *ModelTraits) *pb.ModelTraits {
	if t == nil {
		return nil
	}
	return &pb.ModelTraits{BlockStack: t.BlockStack, Blocks: t.Blocks, Convolves: t.Convolves, Tiles: t.Tiles,
		FallbackDtypes: append([]string(nil), t.FallbackDTypes...)}
}

func fromModelTraits(t *pb.ModelTraits) *ModelTraits {
	if t == nil {
		return nil
	}
	return &ModelTraits{BlockStack: t.GetBlockStack(), Blocks: t.GetBlocks(), Convolves: t.GetConvolves(), Tiles: t.GetTiles(),
		FallbackDTypes: append([]string(nil), t.GetFallbackDtypes()...)}
}

func toVAEInfo(v *VAEInfo) *pb.VaeInfo {
	if v == nil {
		return nil
	}
	return &pb.VaeInfo{
		ScalingFactor: v.ScalingFactor, LatentChannels: v.LatentChannels, SpatialCompressionRatio: v.SpatialCompressionRatio,
		TemporalCompressionRatio: v.TemporalCompressionRatio, InChannels: v.InChannels, OutChannels: v.OutChannels,
	}
}

func fromVAEInfo(v *pb.VaeInfo) *VAEInfo {
	if v == nil {
		return nil
	}
	return &VAEInfo{
		ScalingFactor: v.GetScalingFactor(), LatentChannels: v.GetLatentChannels(), SpatialCompressionRatio: v.GetSpatialCompressionRatio(),
		TemporalCompressionRatio: v.GetTemporalCompressionRatio(), InChannels: v.GetInChannels(), OutChannels: v.GetOutChannels(),
	}
}

func toTransformerInfo(t *TransformerInfo) *pb.TransformerInfo {
	if t == nil {
		return nil
	}
	return &pb.TransformerInfo{
		InChannels: t.InChannels, OutChannels: t.OutChannels, PatchSize: t.PatchSize, PatchSizeT: t.PatchSizeT,
		TextEmbedDim: t.TextEmbedDim, PooledProjectionDim: t.PooledProjectionDim, ImageProjDim: t.ImageProjDim,
		NumLayers: t.NumLayers, NumSingleLayers: t.NumSingleLayers, HasCleanXEmbedder: t.HasCleanXEmbedder,
	}
}

func fromTransformerInfo(t *pb.TransformerInfo) *TransformerInfo {
	if t == nil {
		return nil
	}
	return &TransformerInfo{
		InChannels: t.GetInChannels(), OutChannels: t.GetOutChannels(), PatchSize: t.GetPatchSize(), PatchSizeT: t.GetPatchSizeT(),
		TextEmbedDim: t.GetTextEmbedDim(), PooledProjectionDim: t.GetPooledProjectionDim(), ImageProjDim: t.GetImageProjDim(),
		NumLayers: t.GetNumLayers(), NumSingleLayers: t.GetNumSingleLayers(), HasCleanXEmbedder: t.GetHasCleanXEmbedder(),
	}
}

func toTextEncoderInfo(t *TextEncoderInfo) *pb.TextEncoderInfo {
	if t == nil {
		return nil
	}
	return &pb.TextEncoderInfo{
		LlamaHiddenSize: t.LlamaHiddenSize, ClipHiddenSize: t.ClipHiddenSize,
		LlamaMaxPositionEmbeddings: t.LlamaMaxPositionEmbeddings, ClipMaxPositionEmbeddings: t.ClipMaxPositionEmbeddings,
		TemplatePrefixTokens: t.TemplatePrefixTokens,
	}
}

func fromTextEncoderInfo(t *pb.TextEncoderInfo) *TextEncoderInfo {
	if t == nil {
		return nil
	}
	return &TextEncoderInfo{
		LlamaHiddenSize: t.GetLlamaHiddenSize(), ClipHiddenSize: t.GetClipHiddenSize(),
		LlamaMaxPositionEmbeddings: t.GetLlamaMaxPositionEmbeddings(), ClipMaxPositionEmbeddings: t.GetClipMaxPositionEmbeddings(),
		TemplatePrefixTokens: t.GetTemplatePrefixTokens(),
	}
}

func toProbeRequest(r *ProbeRequest) *pb.ProbeRequest {
	return &pb.ProbeRequest{Backend: r.Backend, Env: r.Env, AllocateBytes: r.AllocateBytes, AllocateDeviceIndex: r.AllocateDeviceIndex}
}

func fromProbeRequest(r *pb.ProbeRequest) *ProbeRequest {
	return &ProbeRequest{Backend: r.GetBackend(), Env: r.GetEnv(), AllocateBytes: r.GetAllocateBytes(), AllocateDeviceIndex: r.GetAllocateDeviceIndex()}
}

func toProbeResponse(r *ProbeResponse) *pb.ProbeResponse {
	out := &pb.ProbeResponse{Backend: r.Backend, DriverVersion: r.DriverVersion}
	for _, d := range r.Devices {
		out.Devices = append(out.Devices, toDevice(d))
	}
	if a := r.Allocate; a != nil {
		out.Allocate = &pb.AllocateResult{Succeeded: a.Succeeded, Error: a.Error, Duration: toDuration(a.Duration)}
	}
	if v := r.Runtime; v != nil {
		out.Runtime = &pb.RuntimeVersions{Backend: v.Backend, RuntimeVersion: v.RuntimeVersion, DriverVersion: v.DriverVersion,
			RuntimeSource: v.RuntimeSource, DriverSource: v.DriverSource}
	}
	return out
}

func fromProbeResponse(r *pb.ProbeResponse) *ProbeResponse {
	out := &ProbeResponse{Backend: r.GetBackend(), DriverVersion: r.GetDriverVersion()}
	for _, d := range r.GetDevices() {
		out.Devices = append(out.Devices, fromDevice(d))
	}
	if a := r.GetAllocate(); a != nil {
		out.Allocate = &AllocateResult{Succeeded: a.GetSucceeded(), Error: a.GetError(), Duration: fromDuration(a.GetDuration())}
	}
	if v := r.GetRuntime(); v != nil {
		out.Runtime = &RuntimeVersions{Backend: v.GetBackend(), RuntimeVersion: v.GetRuntimeVersion(), DriverVersion: v.GetDriverVersion(),
			RuntimeSource: v.GetRuntimeSource(), DriverSource: v.GetDriverSource()}
	}
	return out
}

func toStats(s *Stats) *pb.StatsResponse {
	if s == nil {
		return nil
	}
	out := &pb.StatsResponse{
		AllocatorCurrentBytes: s.AllocatorCurrentBytes, AllocatorPeakBytes: s.AllocatorPeakBytes,
		MemoryCapBytes: s.MemoryCapBytes, HostRssBytes: s.HostRSSBytes, OpCounts: s.OpCounts,
	}
	for _, c := range s.ConvTiers {
		out.ConvTiers = append(out.ConvTiers, &pb.ConvTierStats{
			Tier: pb.ConvTier(c.Tier), Attempts: c.Attempts, Successes: c.Successes, Failures: c.Failures,
			SkippedAsHung: c.SkippedAsHung, TimeNs: uint64(max(c.Time, 0)),
		})
	}
	if s.LoadTime != 0 || s.ComputeTime != 0 {
		out.Timings = &pb.StageTimings{Load: toDuration(s.LoadTime), Compute: toDuration(s.ComputeTime)}
	}
	for _, c := range s.ConvShapes {
		out.ConvShapes = append(out.ConvShapes, &pb.ConvShapeStats{ShapeKey: c.ShapeKey, Tier: pb.ConvTier(c.Tier),
			Calls: c.Calls, FirstNs: uint64(max(c.First, 0)), TimeNs: uint64(max(c.Time, 0))})
	}
	return out
}

func fromStats(s *pb.StatsResponse) *Stats {
	if s == nil {
		return nil
	}
	out := &Stats{
		AllocatorCurrentBytes: s.GetAllocatorCurrentBytes(), AllocatorPeakBytes: s.GetAllocatorPeakBytes(),
		MemoryCapBytes: s.GetMemoryCapBytes(), HostRSSBytes: s.GetHostRssBytes(), OpCounts: s.GetOpCounts(),
		LoadTime: fromDuration(s.GetTimings().GetLoad()), ComputeTime: fromDuration(s.GetTimings().GetCompute()),
	}
	for _, c := range s.GetConvShapes() {
		out.ConvShapes = append(out.ConvShapes, ConvShapeStats{ShapeKey: c.GetShapeKey(), Tier: ConvTier(c.GetTier()),
			Calls: c.GetCalls(), First: time.Duration(min(c.GetFirstNs(), math.MaxInt64)), Time: time.Duration(min(c.GetTimeNs(), math.MaxInt64))})
	}
	for _, c := range s.GetConvTiers() {
		out.ConvTiers = append(out.ConvTiers, ConvTierStats{
			Tier: ConvTier(c.GetTier()), Attempts: c.GetAttempts(), Successes: c.GetSuccesses(), Failures: c.GetFailures(),
			SkippedAsHung: c.GetSkippedAsHung(), Time: time.Duration(c.GetTimeNs()),
		})
	}
	return out
}

func toTiling(t *VAETiling) *pb.VaeTiling {
	if t == nil {
		return nil
	}
	return &pb.VaeTiling{
		EnableSpatialTiling: t.EnableSpatialTiling,
		TileSampleMinHeight: t.TileSampleMinHeight, TileSampleMinWidth: t.TileSampleMinWidth,
		TileSampleMinNumFrames: t.TileSampleMinNumFrames, TileSampleStrideHeight: t.TileSampleStrideHeight,
		TileSampleStrideWidth: t.TileSampleStrideWidth, TileSampleStrideNumFrames: t.TileSampleStrideNumFrames,
	}
}

func fromTiling(t *pb.VaeTiling) *VAETiling {
	if t == nil {
		return nil
	}
	return &VAETiling{
		EnableSpatialTiling: t.GetEnableSpatialTiling(),
		TileSampleMinHeight: t.GetTileSampleMinHeight(), TileSampleMinWidth: t.GetTileSampleMinWidth(),
		TileSampleMinNumFrames: t.GetTileSampleMinNumFrames(), TileSampleStrideHeight: t.GetTileSampleStrideHeight(),
		TileSampleStrideWidth: t.GetTileSampleStrideWidth(), TileSampleStrideNumFrames: t.GetTileSampleStrideNumFrames(),
	}
}

func toRunRequest(r *RunRequest) (*pb.RunRequest, error) {
	out := &pb.RunRequest{JobId: r.JobID}
	switch s := r.Stage.(type) {
	case *TextEncodeRequest:
		out.Stage = &pb.RunRequest_TextEncode{TextEncode: &pb.TextEncodeRequest{
			Prompt: s.Prompt, NegativePrompt: s.NegativePrompt, Cfg: s.CFG,
			LlamaMaxLength: s.LlamaMaxLength, ClipMaxLength: s.ClipMaxLength, CropStart: s.CropStart, PadLength: s.PadLength,
			LlamaVec: toTensorRef(s.LlamaVec), LlamaMask: toTensorRef(s.LlamaMask), ClipPooler: toTensorRef(s.ClipPooler),
			LlamaVecN: toTensorRef(s.LlamaVecN), LlamaMaskN: toTensorRef(s.LlamaMaskN), ClipPoolerN: toTensorRef(s.ClipPoolerN),
			LlamaIds: toTensorRef(s.LlamaIDs), LlamaAttentionMask: toTensorRef(s.LlamaAttentionMask), ClipIds: toTensorRef(s.ClipIDs),
			ExtraPrompts: toExtraPrompts(s.ExtraPrompts),
		}}
	case *VAEEncodeRequest:
		out.Stage = &pb.RunRequest_VaeEncode{VaeEncode: &pb.VaeEncodeRequest{
			Pixels: toTensorRef(s.Pixels), Tiling: toTiling(s.Tiling), Latents: toTensorRef(s.Latents), Logvar: toTensorRef(s.Logvar),
			IndependentFrames: s.IndependentFrames,
		}}
	case *VAEDecodeRequest:
		out.Stage = &pb.RunRequest_VaeDecode{VaeDecode: &pb.VaeDecodeRequest{
			Latents: toTensorRef(s.Latents), Tiling: toTiling(s.Tiling), Pixels: toTensorRef(s.Pixels),
		}}
	case *ImageEncodeRequest:
		out.Stage = &pb.RunRequest_ImageEncode{ImageEncode: &pb.ImageEncodeRequest{
			Image: toTensorRef(s.Image), LastHiddenState: toTensorRef(s.LastHiddenState),
		}}
	case *TransformerSectionRequest:
		out.Stage = &pb.RunRequest_TransformerSection{TransformerSection: &pb.TransformerSectionRequest{
			LlamaVec: toTensorRef(s.LlamaVec), LlamaMask: toTensorRef(s.LlamaMask), ClipPooler: toTensorRef(s.ClipPooler),
			ImageEmbeddings: toTensorRef(s.ImageEmbeddings),
			LlamaVecN:       toTensorRef(s.Negative.LlamaVec), LlamaMaskN: toTensorRef(s.Negative.LlamaMask), ClipPoolerN: toTensorRef(s.Negative.ClipPooler),
			CleanLatents: toTensorRef(s.CleanLatents), CleanLatentIndices: s.CleanLatentIndices,
			CleanLatents_2X: toTensorRef(s.CleanLatents2x), CleanLatent_2XIndices: s.CleanLatent2xIndices,
			CleanLatents_4X: toTensorRef(s.CleanLatents4x), CleanLatent_4XIndices: s.CleanLatent4xIndices,
			LatentIndices: s.LatentIndices, Steps: s.Steps, Cfg: s.CFG, Gs: s.GS, Rs: s.RS, Shift: s.Shift,
			UseTeacache: s.UseTeaCache, TeacacheThreshold: s.TeaCacheThreshold, Sampler: pb.SamplerVariant(s.Sampler),
			GeneratorState: s.GeneratorState, Seed: s.Seed, Width: s.Width, Height: s.Height, Frames: s.Frames,
			Latents: toTensorRef(s.Latents), StepPreviews: toTensorRefs(s.StepPreviews), Magcache: toMagCache(s.MagCache),
		}}
	case *TransformerForwardRequest:
		out.Stage = &pb.RunRequest_TransformerForward{TransformerForward: &pb.TransformerForwardRequest{
			HiddenStates: toTensorRef(s.HiddenStates), Timestep: s.Timestep, Guidance: s.Guidance,
			LlamaVec: toTensorRef(s.LlamaVec), LlamaMask: toTensorRef(s.LlamaMask), ClipPooler: toTensorRef(s.ClipPooler),
			ImageEmbeddings: toTensorRef(s.ImageEmbeddings),
			CleanLatents:    toTensorRef(s.CleanLatents), CleanLatentIndices: s.CleanLatentIndices,
			CleanLatents_2X: toTensorRef(s.CleanLatents2x), CleanLatent_2XIndices: s.CleanLatent2xIndices,
			CleanLatents_4X: toTensorRef(s.CleanLatents4x), CleanLatent_4XIndices: s.CleanLatent4xIndices,
			LatentIndices: s.LatentIndices, Velocity: toTensorRef(s.Velocity),
		}}
	case nil:
		return nil, Errorf(CodeInvalidArgument, "run request has no stage")
	default:
		return nil, Errorf(CodeInvalidArgument, "unknown stage type %T", s)
	}
	return out, nil
}

// conditioningSource is what the two transformer requests carry alike on the wire: the section's
// conditioning (the worker proto keeps it as flat fields of each message).
type conditioningSource interface {
	GetLlamaVec() *pb.TensorRef
	GetLlamaMask() *pb.TensorRef
	GetClipPooler() *pb.TensorRef
	GetImageEmbeddings() *pb.TensorRef
	GetCleanLatents() *pb.TensorRef
	GetCleanLatentIndices() []int64
	GetCleanLatents_2X() *pb.TensorRef
	GetCleanLatent_2XIndices() []int64
	GetCleanLatents_4X() *pb.TensorRef
	GetCleanLatent_4XIndices() []int64
	GetLatentIndices() []int64
}

// fromConditioning reads a transformer request's conditioning fields.
func fromConditioning(t conditioningSource) TransformerConditioning {
	return TransformerConditioning{
		TransformerText: TransformerText{LlamaVec: fromTensorRef(t.GetLlamaVec()), LlamaMask: fromTensorRef(t.GetLlamaMask()), ClipPooler: fromTensorRef(t.GetClipPooler())},
		ImageEmbeddings: fromTensorRef(t.GetImageEmbeddings()),
		CleanLatents:    fromTensorRef(t.GetCleanLatents()), CleanLatentIndices: t.GetCleanLatentIndices(),
		CleanLatents2x: fromTensorRef(t.GetCleanLatents_2X()), CleanLatent2xIndices: t.GetCleanLatent_2XIndices(),
		CleanLatents4x: fromTensorRef(t.GetCleanLatents_4X()), CleanLatent4xIndices: t.GetCleanLatent_4XIndices(),
		LatentIndices: t.GetLatentIndices(),
	}
}

func fromRunRequest(r *pb.RunRequest) (*RunRequest, error) {
	out := &RunRequest{JobID: r.GetJobId()}
	switch s := r.GetStage().(type) {
	case *pb.RunRequest_TextEncode:
		t := s.TextEncode
		out.Stage = &TextEncodeRequest{
			Prompt: t.GetPrompt(), NegativePrompt: t.GetNegativePrompt(), CFG: t.GetCfg(),
			LlamaMaxLength: t.GetLlamaMaxLength(), ClipMaxLength: t.GetClipMaxLength(), CropStart: t.GetCropStart(), PadLength: t.GetPadLength(),
			LlamaVec: fromTensorRef(t.GetLlamaVec()), LlamaMask: fromTensorRef(t.GetLlamaMask()), ClipPooler: fromTensorRef(t.GetClipPooler()),
			LlamaVecN: fromTensorRef(t.GetLlamaVecN()), LlamaMaskN: fromTensorRef(t.GetLlamaMaskN()), ClipPoolerN: fromTensorRef(t.GetClipPoolerN()),
			LlamaIDs: fromTensorRef(t.GetLlamaIds()), LlamaAttentionMask: fromTensorRef(t.GetLlamaAttentionMask()), ClipIDs: fromTensorRef(t.GetClipIds()),
			ExtraPrompts: fromExtraPrompts(t.GetExtraPrompts()),
		}
	case *pb.RunRequest_VaeEncode:
		v := s.VaeEncode
		out.Stage = &VAEEncodeRequest{Pixels: fromTensorRef(v.GetPixels()), Tiling: fromTiling(v.GetTiling()), Latents: fromTensorRef(v.GetLatents()),
			Logvar: fromTensorRef(v.GetLogvar()), IndependentFrames: v.GetIndependentFrames()}
	case *pb.RunRequest_VaeDecode:
		v := s.VaeDecode
		out.Stage = &VAEDecodeRequest{Latents: fromTensorRef(v.GetLatents()), Tiling: fromTiling(v.GetTiling()), Pixels: fromTensorRef(v.GetPixels())}
	case *pb.RunRequest_ImageEncode:
		v := s.ImageEncode
		out.Stage = &ImageEncodeRequest{Image: fromTensorRef(v.GetImage()), LastHiddenState: fromTensorRef(v.GetLastHiddenState())}
	case *pb.RunRequest_TransformerSection:
		t := s.TransformerSection
		out.Stage = &TransformerSectionRequest{
			TransformerConditioning: fromConditioning(t),
			Negative:                TransformerText{LlamaVec: fromTensorRef(t.GetLlamaVecN()), LlamaMask: fromTensorRef(t.GetLlamaMaskN()), ClipPooler: fromTensorRef(t.GetClipPoolerN())},
			Steps:                   t.GetSteps(), CFG: t.GetCfg(), GS: t.GetGs(), RS: t.GetRs(), Shift: t.Shift,
			UseTeaCache: t.GetUseTeacache(), TeaCacheThreshold: t.GetTeacacheThreshold(), Sampler: SamplerVariant(t.GetSampler()),
			GeneratorState: t.GetGeneratorState(), Seed: t.GetSeed(), Width: t.GetWidth(), Height: t.GetHeight(), Frames: t.GetFrames(),
			Latents: fromTensorRef(t.GetLatents()), StepPreviews: fromTensorRefs(t.GetStepPreviews()), MagCache: fromMagCache(t.GetMagcache()),
		}
	case *pb.RunRequest_TransformerForward:
		t := s.TransformerForward
		out.Stage = &TransformerForwardRequest{
			HiddenStates: fromTensorRef(t.GetHiddenStates()), Timestep: t.GetTimestep(), Guidance: t.GetGuidance(),
			TransformerConditioning: fromConditioning(t),
			Velocity:                fromTensorRef(t.GetVelocity()),
		}
	case nil:
		return nil, Errorf(CodeInvalidArgument, "run request has no stage")
	default:
		return nil, Errorf(CodeInvalidArgument, "unknown stage %T", s)
	}
	return out, nil
}

func toEvent(e Event) (*pb.RunEvent, error) {
	switch e := e.(type) {
	case *Progress:
		return &pb.RunEvent{Event: &pb.RunEvent_Progress{Progress: &pb.Progress{
			Phase: e.Phase, Step: e.Step, TotalSteps: e.TotalSteps, Elapsed: toDuration(e.Elapsed),
		}}}, nil
	case *StepPreview:
		return &pb.RunEvent{Event: &pb.RunEvent_StepPreview{StepPreview: &pb.StepPreview{Step: e.Step, Denoised: toTensorRef(e.Denoised)}}}, nil
	case *ConvFallback:
		return &pb.RunEvent{Event: &pb.RunEvent_ConvFallback{ConvFallback: &pb.ConvFallback{
			ShapeKey: e.ShapeKey, Tier: pb.ConvTier(e.Tier), Outcome: pb.ConvOutcome(e.Outcome), Detail: e.Detail,
		}}}, nil
	case *LogLine:
		return &pb.RunEvent{Event: &pb.RunEvent_Log{Log: &pb.LogLine{Level: pb.LogLevel(e.Level), Message: e.Message, Fields: e.Fields}}}, nil
	}
	return nil, fmt.Errorf("unknown event type %T", e)
}

// fromEvent converts a non-final event; final events (result, error) are handled by the caller.
func fromEvent(e *pb.RunEvent) (Event, error) {
	switch v := e.GetEvent().(type) {
	case *pb.RunEvent_Progress:
		p := v.Progress
		return &Progress{Phase: p.GetPhase(), Step: p.GetStep(), TotalSteps: p.GetTotalSteps(), Elapsed: fromDuration(p.GetElapsed())}, nil
	case *pb.RunEvent_StepPreview:
		return &StepPreview{Step: v.StepPreview.GetStep(), Denoised: fromTensorRef(v.StepPreview.GetDenoised())}, nil
	case *pb.RunEvent_ConvFallback:
		c := v.ConvFallback
		return &ConvFallback{ShapeKey: c.GetShapeKey(), Tier: ConvTier(c.GetTier()), Outcome: ConvOutcome(c.GetOutcome()), Detail: c.GetDetail()}, nil
	case *pb.RunEvent_Log:
		return &LogLine{Level: LogLevel(v.Log.GetLevel()), Message: v.Log.GetMessage(), Fields: v.Log.GetFields()}, nil
	}
	return nil, fmt.Errorf("unexpected event %T", e.GetEvent())
}

func toResult(r *Result) *pb.Result {
	return &pb.Result{Outputs: toTensorRefs(r.Outputs), Stats: toStats(r.Stats), GeneratorState: r.GeneratorState,
		VaeTiling: toTilingUsed(r.VAETiling), CacheSkippedSteps: r.CacheSkippedSteps}
}

func fromResult(r *pb.Result) *Result {
	return &Result{Outputs: fromTensorRefs(r.GetOutputs()), Stats: fromStats(r.GetStats()), GeneratorState: r.GetGeneratorState(),
		VAETiling: fromTilingUsed(r.GetVaeTiling()), CacheSkippedSteps: r.GetCacheSkippedSteps()}
}

func toMagCache(m *MagCacheSettings) *pb.MagCacheSettings {
	if m == nil {
		return nil
	}
	return &pb.MagCacheSettings{Calibration: pb.MagCacheCalibration(m.Calibration), Threshold: m.Threshold,
		MaxConsecutiveSkips: m.MaxConsecutiveSkips, RetentionRatio: m.RetentionRatio}
}

func fromMagCache(m *pb.MagCacheSettings) *MagCacheSettings {
	if m == nil {
		return nil
	}
	return &MagCacheSettings{Calibration: MagCacheCalibration(m.GetCalibration()), Threshold: m.GetThreshold(),
		MaxConsecutiveSkips: m.GetMaxConsecutiveSkips(), RetentionRatio: m.RetentionRatio}
}

func toError(e *Error) *pb.Error {
	return &pb.Error{Code: pb.ErrorCode(e.Code), Message: e.Message, RequestedBytes: e.RequestedBytes, AvailableBytes: e.AvailableBytes,
		Traits: toModelTraits(e.Traits)}
}

func fromError(e *pb.Error) *Error {
	return &Error{Code: ErrorCode(e.GetCode()), Message: e.GetMessage(), RequestedBytes: e.GetRequestedBytes(), AvailableBytes: e.GetAvailableBytes(),
		Traits: fromModelTraits(e.GetTraits())}
}

func toTilingUsed(t *VAETilingUsed) *pb.VaeTilingUsed {
	if t == nil {
		return nil
	}
	return &pb.VaeTilingUsed{Tiling: toTiling(&t.Tiling), Chosen: t.Chosen, PeakEstimateBytes: t.PeakEstimateBytes,
		BudgetBytes: t.BudgetBytes, Runs: t.Runs}
}

func fromTilingUsed(t *pb.VaeTilingUsed) *VAETilingUsed {
	if t == nil {
		return nil
	}
	out := &VAETilingUsed{Chosen: t.GetChosen(), PeakEstimateBytes: t.GetPeakEstimateBytes(), BudgetBytes: t.GetBudgetBytes(), Runs: t.GetRuns()}
	if tl := fromTiling(t.GetTiling()); tl != nil {
		out.Tiling = *tl
	}
	return out
}

func toEstimateRequest(r *EstimateRequest) *pb.EstimateRequest {
	return &pb.EstimateRequest{Load: toLoadRequest(&r.Load), VaeDecodeLatentFrames: r.VAEDecodeLatentFrames}
}

func fromEstimateRequest(r *pb.EstimateRequest) *EstimateRequest {
	out := &EstimateRequest{VAEDecodeLatentFrames: r.GetVaeDecodeLatentFrames()}
	if l := r.GetLoad(); l != nil {
		out.Load = *fromLoadRequest(l)
	}
	return out
}

func toEstimateResponse(r *EstimateResponse) *pb.EstimateResponse {
	return &pb.EstimateResponse{WeightBytes: r.WeightBytes, MinDeviceBytes: r.MinDeviceBytes, FullDeviceBytes: r.FullDeviceBytes,
		HostBytesAtMin: r.HostBytesAtMin}
}

func fromEstimateResponse(r *pb.EstimateResponse) *EstimateResponse {
	return &EstimateResponse{WeightBytes: r.GetWeightBytes(), MinDeviceBytes: r.GetMinDeviceBytes(), FullDeviceBytes: r.GetFullDeviceBytes(),
		HostBytesAtMin: r.GetHostBytesAtMin()}
}
