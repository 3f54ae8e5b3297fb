// Package workerkit is the worker process machinery shared by the supervisor and every worker
// binary (textenc, vae, clipvision, transformer, probe).
//
// Worker side: a worker implements Worker and its main calls Main, which serves the worker
// protocol over go-plugin (gRPC), keeps the beacon page current and exits when the supervisor is
// gone. Supervisor side: Start runs a worker binary in its own process group with a parent-death
// signal, performs the go-plugin handshake and returns a Process whose methods are the Worker
// calls (each with a context deadline), plus the beacon, the exit status and Kill.
//
// Neither side sees generated proto types: the Go types below mirror worker.proto and the gRPC
// adapters only copy fields.
package workerkit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/framepackd/framepackd/internal/safetensors"
)

// Worker is the protocol every worker serves. Methods take ctx first; the supervisor's calls
// always carry a deadline. A panic in any of them is recovered by the server (workerkit), logged
// with its stack and answered with a CodeInternal error: the worker needs no recover of its own.
type Worker interface {
	// Load opens the backend and loads the model; it is the first call and comes once.
	Load(ctx context.Context, req *LoadRequest) (*LoadResponse, error)
	// Run runs one stage, reporting progress through emit, and returns the stage's result.
	Run(ctx context.Context, req *RunRequest, emit Emit) (*Result, error)
	// Stats returns the worker's counters; it may be called at any time.
	Stats(ctx context.Context) (*Stats, error)
}

// Prober is the probe worker's call: a worker that implements it serves Probe; the model
// workers do not, and the server answers their Probe with CodeInvalidArgument.
type Prober interface {
	// Probe lists the devices of a backend without loading a model.
	Probe(ctx context.Context, req *ProbeRequest) (*ProbeResponse, error)
}

// Estimator is a model worker's memory estimate before Load (worker.proto Estimate): a worker
// that implements it serves Estimate; the server answers the others' with CodeUnimplemented.
// Estimate reads the model's config and checkpoint headers only: no backend, no device.
type Estimator interface {
	Estimate(ctx context.Context, req *EstimateRequest) (*EstimateResponse, error)
}

// remote is a worker as the supervisor calls it: every call of the service.
type remote interface {
	Worker
	Prober
	Estimator
}

// EstimateRequest asks for the memory a model needs for a workload (worker.proto
// EstimateRequest).
type EstimateRequest struct {
	// Load is the LoadRequest that would follow (its MemoryCapBytes is ignored).
	Load LoadRequest
	// VAEDecodeLatentFrames is the most latent frames one VAE decode takes (0: the workload's
	// window).
	VAEDecodeLatentFrames uint32
}

// EstimateResponse is a model's memory need, in the allocator's bytes (worker.proto
// EstimateResponse).
type EstimateResponse struct {
	WeightBytes uint64
	// MinDeviceBytes is the least cap the model runs under (most streaming, smallest tiles);
	// FullDeviceBytes the cap of its fastest configuration.
	MinDeviceBytes, FullDeviceBytes uint64
	// HostBytesAtMin is the host memory of the streamed weights at MinDeviceBytes.
	HostBytesAtMin uint64
}

// Emit sends one event of a running stage to the supervisor. An error means the stream is gone
// (the supervisor cancelled or died); the stage should stop.
type Emit func(Event) error

// Event is one non-final message of a Run stream: *Progress, *StepPreview, *ConvFallback or
// *LogLine.
type Event interface{ isEvent() }

func (*Progress) isEvent()     {}
func (*StepPreview) isEvent()  {}
func (*ConvFallback) isEvent() {}
func (*LogLine) isEvent()      {}

// TensorRef names one tensor inside a safetensors segment in shared memory (see package shm).
type TensorRef struct {
	Path  string
	Name  string
	DType safetensors.DType // checked on inputs when set; reported on outputs
	Shape []int64           // checked on inputs when non-empty; reported on outputs
}

// ConvTier is one step of the convolution fallback chain, best first.
type ConvTier int32

// Convolution tiers (worker.proto ConvTier).
const (
	ConvTierUnspecified   ConvTier = 0
	ConvTierVendorTuned   ConvTier = 1
	ConvTierVendorDefault ConvTier = 2
	ConvTierOwnKernel     ConvTier = 3
	ConvTierCPU           ConvTier = 4
)

// ConvOutcome is what happened when one convolution shape met one tier.
type ConvOutcome int32

// Convolution outcomes (worker.proto ConvOutcome).
const (
	ConvOutcomeUnspecified ConvOutcome = 0
	ConvOutcomeSucceeded   ConvOutcome = 1
	ConvOutcomeFailed      ConvOutcome = 2
	ConvOutcomeSkippedHung ConvOutcome = 3
	ConvOutcomeUnavailable ConvOutcome = 4
)

// ConvPolicy tells a worker how to choose convolution tiers.
type ConvPolicy struct {
	TierOverrides     []ConvTierOverride
	ForcedTier        ConvTier
	DecisionCachePath string
}

// ConvTierOverride makes one convolution shape start at a given tier.
type ConvTierOverride struct {
	ShapeKey string
	Tier     ConvTier
}

// ConvTierStats counts what one tier did in a worker.
type ConvTierStats struct {
	Tier          ConvTier
	Attempts      uint64
	Successes     uint64
	Failures      uint64
	SkippedAsHung uint64
	Time          time.Duration
}

// LoadRequest asks a worker to open its backend and load its model.
type LoadRequest struct {
	ModelDir          string
	DType             string // weight storage: "fp32", "fp16", "bf16", "auto" (the checkpoint's); empty: the activation dtype
	Backend           string // "cpu", "cuda", "hip", "auto"; empty: auto
	DeviceIndex       uint32
	PCIBusID          string // when set, the GPU with this PCI bus id ("0000:65:00.0"), not DeviceIndex
	MemoryCapBytes    uint64 // 0: no cap
	ConvPolicy        *ConvPolicy
	Env               map[string]string
	BeaconPath        string // optional: a file beacon, for workers started without the inherited one
	MaxResidentBlocks uint32
	Fault             *Fault     // tests only
	Loras             []LoraSpec // transformer only: LoRAs merged at load, in order
	// Workload is the job the model is loaded for (transformer: the activation estimate that
	// residency is planned around); nil: none reserved.
	Workload *Workload
	// ActivationDType is the dtype activations are computed in: "fp32", "bf16", "fp16"; empty:
	// the test knob envconfig.ActivationDType, else the model's default for the backend
	// (modelrt.Base.Activation).
	ActivationDType string
	// SiglipProcessor is the clipvision worker's SiglipImageProcessor: "torchvision" (empty)
	// or "pil".
	SiglipProcessor string
	// Checkpoint is a single safetensors file loaded instead of ModelDir's weights (config from
	// ModelDir), 16- or 8-bit (internal/fp8 tells the format); empty: ModelDir's. Transformer only.
	Checkpoint string
	// Weights is "fp8" to quantize 16/32-bit Linear weights to e4m3 per output channel at load;
	// empty: as DType says. Transformer only.
	Weights string
	// FP8Compute is "weight_only" (or empty), "tensor" or "token" (runtime.ParseFP8Compute).
	FP8Compute string
}

// Workload is the size of the job a worker is loaded for (worker.proto Workload).
type Workload struct {
	Height, Width    uint32 // pixels
	LatentWindowSize uint32 // latent frames per section
	// ReserveBytes is device memory kept free beside the resident weights
	// (gpu_memory_preservation_gb); the transformer reserves max(this, its estimate).
	ReserveBytes uint64
}

// LoraSpec names one LoRA file merged into the transformer at load (worker.proto LoraSpec).
type LoraSpec struct {
	Path     string
	Strength float64
}

// LoraApplied reports one LoRA the transformer worker merged (worker.proto LoraApplied).
type LoraApplied struct {
	Path           string
	Strength       float64
	Format         string // "peft", "musubi", "original"
	WeightsChanged uint32
}

// Fault injects failures into a worker, for tests (worker.proto Fault).
type Fault struct {
	ExitAtOp         uint64
	ExitSignal       int32
	HangAtOp         uint64
	OOMAtOp          uint64
	HangConvShapeKey string
	HangConvTier     ConvTier
	HoldVRAMBytes    uint64
	HoldVRAMSeconds  uint32
	OOMAtLoad        bool
}

// LoadResponse says what a worker loaded and where. The model's constants come in the field of
// its kind (VAE, Transformer or TextEncoder); the others are nil.
type LoadResponse struct {
	Backend              string
	DType                string
	Device               *Device
	WeightBytes          uint64
	DeviceAllocatedBytes uint64
	LoadDuration         time.Duration
	VAE                  *VAEInfo         // vae worker only
	Transformer          *TransformerInfo // transformer worker only
	TextEncoder          *TextEncoderInfo // textenc worker only
	// Loras lists the LoRAs merged into the transformer (TransformerInfo.loras on the wire).
	Loras []LoraApplied
	// ResidentBlocks and StreamedBlocks are the transformer blocks (textenc: Llama layers)
	// kept on the device and streamed from host memory.
	ResidentBlocks, StreamedBlocks uint32
	// WeightsFormat is the 8-bit weights' format ("" none, "plain", "comfy", "musubi",
	// "quantized"); FP8Compute the fp8 compute mode in use (empty without 8-bit weights).
	WeightsFormat, FP8Compute string
	// Traits is what the model has that a retry can change (nil: not reported).
	Traits *ModelTraits
}

// ModelTraits is what a model has that a retry of its stage can change, declared by its worker
// (LoadResponse): the supervisor's degradation ladder reads it instead of knowing the models.
type ModelTraits struct {
	// BlockStack names the stack of repeated blocks the worker keeps on the device up to
	// LoadRequest.MaxResidentBlocks, streaming the rest from host memory ("transformer
	// blocks", "llama layers"); "" for a model without one.
	BlockStack string
	// Blocks is the stack's length: the blocks one forward runs.
	Blocks uint32
	// Convolves says the model runs convolutions through the conv chain (ConvPolicy applies).
	Convolves bool
	// Tiles says the model's stages take spatial tiles (the VAE's tiling).
	Tiles bool
	// FallbackDTypes are the activation dtypes narrower than the loaded one that the model can
	// run in instead, widest first (LoadRequest.ActivationDType names one).
	FallbackDTypes []string
}

// VAEInfo holds a loaded VAE's constants, so the supervisor need not read its config.json.
// vae_encode returns and vae_decode takes unscaled latents: the caller multiplies by
// ScalingFactor after encoding and divides by it before decoding.
type VAEInfo struct {
	ScalingFactor            float64 // 0.476986 for HunyuanVideo
	LatentChannels           uint32
	SpatialCompressionRatio  uint32 // pixels per latent along H and W (8)
	TemporalCompressionRatio uint32 // T pixel frames → (T−1)/4+1 latent frames (4)
	InChannels               uint32 // pixel channels the encoder takes
	OutChannels              uint32 // pixel channels the decoder writes
}

// TransformerInfo holds a loaded packed transformer's input widths and stack size.
type TransformerInfo struct {
	InChannels          uint32
	OutChannels         uint32
	PatchSize           uint32 // latent H and W must be multiples of it
	PatchSizeT          uint32
	TextEmbedDim        uint32 // llama_vec width
	PooledProjectionDim uint32 // clip_pooler width
	ImageProjDim        uint32 // image_embeddings width; 0 without an image projection
	NumLayers           uint32 // double-stream blocks
	NumSingleLayers     uint32 // single-stream blocks
	HasCleanXEmbedder   bool
}

// TextEncoderInfo holds the loaded text encoders' output widths and length bounds.
type TextEncoderInfo struct {
	LlamaHiddenSize            uint32 // llama_vec width
	ClipHiddenSize             uint32 // clip_pooler width
	LlamaMaxPositionEmbeddings uint32 // bounds llama_max_length + crop_start; 0: unknown
	ClipMaxPositionEmbeddings  uint32 // bounds clip_max_length
	TemplatePrefixTokens       uint32 // Llama ids before the prompt (95: the default crop_start)
}

// ProbeRequest asks the probe worker to initialise a backend and list its devices.
type ProbeRequest struct {
	Backend             string // "cpu", "cuda", "hip", "auto"; empty: auto
	Env                 map[string]string
	AllocateBytes       uint64 // > 0: allocate, touch and free this much on AllocateDeviceIndex
	AllocateDeviceIndex uint32
}

// ProbeResponse lists what a probe found.
type ProbeResponse struct {
	Backend       string
	DriverVersion string
	Devices       []Device
	Allocate      *AllocateResult // nil when no allocation was asked
	// Runtime is the GPU runtime and what the host driver serves; nil on the cpu.
	Runtime *RuntimeVersions
}

// RuntimeVersions is the GPU runtime a worker links (the container's CUDA or ROCm) and the
// newest runtime release the host driver serves (internal/gpuversion reads them).
type RuntimeVersions struct {
	Backend        string // "cuda" or "hip"
	RuntimeVersion string // "12.8", "6.4.43484"; empty when unknown
	DriverVersion  string // "12.4", "6.1"; empty when unknown
	RuntimeSource  string // where each was read, or why it could not be
	DriverSource   string
}

// Device describes one compute device.
type Device struct {
	Index            uint32
	Name             string
	Arch             string
	TotalMemoryBytes uint64
	FreeMemoryBytes  uint64
	PCIBusID         string
}

// AllocateResult is the outcome of a probe's allocate-and-free test.
type AllocateResult struct {
	Succeeded bool
	Error     string
	Duration  time.Duration
}

// Stats holds a worker's counters since it started.
type Stats struct {
	AllocatorCurrentBytes uint64
	AllocatorPeakBytes    uint64
	MemoryCapBytes        uint64
	HostRSSBytes          uint64
	ConvTiers             []ConvTierStats
	LoadTime              time.Duration
	ComputeTime           time.Duration
	OpCounts              map[string]uint64
	ConvShapes            []ConvShapeStats // per conv shape served, by shape key
}

// ConvShapeStats is what the conv chain did for one shape (worker.proto ConvShapeStats).
type ConvShapeStats struct {
	ShapeKey string
	Tier     ConvTier      // the tier that last served it
	Calls    uint64        // convolutions served
	First    time.Duration // the serving tier's first run, synchronised (vendor_tuned: with Find)
	Time     time.Duration // time in the serving tier over all calls
}

// RunRequest asks a loaded worker to run one stage.
type RunRequest struct {
	JobID string
	Stage Stage
}

// Stage is the work of one Run: *TextEncodeRequest, *VAEEncodeRequest, *VAEDecodeRequest,
// *ImageEncodeRequest, *TransformerSectionRequest or *TransformerForwardRequest.
type Stage interface{ isStage() }

func (*TextEncodeRequest) isStage()         {}
func (*VAEEncodeRequest) isStage()          {}
func (*VAEDecodeRequest) isStage()          {}
func (*ImageEncodeRequest) isStage()        {}
func (*TransformerSectionRequest) isStage() {}
func (*TransformerForwardRequest) isStage() {}

// TextEncodeRequest encodes a prompt and its negative with LLaMA and CLIP-L.
type TextEncodeRequest struct {
	Prompt         string
	NegativePrompt string
	CFG            float32
	LlamaMaxLength uint32
	ClipMaxLength  uint32
	CropStart      uint32
	PadLength      uint32
	LlamaVec       TensorRef
	LlamaMask      TensorRef
	ClipPooler     TensorRef
	LlamaVecN      TensorRef
	LlamaMaskN     TensorRef
	ClipPoolerN    TensorRef
	// Optional outputs (zero: not written), for checks: the positive prompt's tokenizer outputs.
	LlamaIDs           TensorRef // [1, llama_max_length + crop_start], I64 or I32
	LlamaAttentionMask TensorRef // the tokenizer's mask for LlamaIDs, I64, U8 or BOOL
	ClipIDs            TensorRef // [1, clip_max_length], I64 or I32
	// ExtraPrompts are more positive prompts encoded in the same run (a timed prompt's).
	ExtraPrompts []ExtraPrompt
}

// ExtraPrompt is one more positive prompt of a TextEncodeRequest and its outputs.
type ExtraPrompt struct {
	Prompt     string
	LlamaVec   TensorRef
	LlamaMask  TensorRef
	ClipPooler TensorRef
}

// VAETiling sets how the VAE splits its work, as diffusers does: framewise (temporal) chunking
// always on, spatial tiling only when enabled; zero sizes mean the model's defaults.
type VAETiling struct {
	EnableSpatialTiling       bool
	TileSampleMinHeight       uint32
	TileSampleMinWidth        uint32
	TileSampleMinNumFrames    uint32
	TileSampleStrideHeight    uint32
	TileSampleStrideWidth     uint32
	TileSampleStrideNumFrames uint32
}

// VAEEncodeRequest encodes pixels into the posterior's unscaled mean (Latents) and log-variance
// (Logvar); multiply the mean by VAEInfo.ScalingFactor for the transformer.
type VAEEncodeRequest struct {
	Pixels  TensorRef
	Tiling  *VAETiling // nil: chosen by the worker from its memory cap
	Latents TensorRef
	// Logvar is optional: zero means the tensor "<Latents.Name>.logvar" in Latents' file.
	Logvar TensorRef
	// IndependentFrames, when > 0, encodes the frames in independent runs of this many frames
	// (worker.proto VaeEncodeRequest.independent_frames).
	IndependentFrames uint32
}

// VAEDecodeRequest decodes unscaled latents (already divided by VAEInfo.ScalingFactor) into
// pixels.
type VAEDecodeRequest struct {
	Latents TensorRef
	Tiling  *VAETiling // nil: chosen by the worker from its memory cap
	Pixels  TensorRef
}

// ImageEncodeRequest runs SigLIP on one image.
type ImageEncodeRequest struct {
	Image           TensorRef
	LastHiddenState TensorRef
}

// SamplerVariant selects the UniPC update rule.
type SamplerVariant int32

// Sampler variants (worker.proto SamplerVariant).
const (
	SamplerUnspecified SamplerVariant = 0
	SamplerUniPCBH1    SamplerVariant = 1
	SamplerUniPCBH2    SamplerVariant = 2
)

// TransformerText is one prompt branch's text conditioning in shared memory.
type TransformerText struct {
	LlamaVec   TensorRef // LLaMA hidden_states[-3] cropped and padded [1, L, 4096]
	LlamaMask  TensorRef // its 0/1 attention mask [1, L]
	ClipPooler TensorRef // CLIP-L pooled output [1, 768]
}

// TransformerConditioning is what the packed transformer is conditioned on besides the noisy
// latents, as tensors in shared memory: the one form both transformer stages take across the
// worker boundary (the worker reads it into a conditioning.Conditioning). Clean latents are
// optional, each with its frame indices; empty LatentIndices mean 0..T−1.
type TransformerConditioning struct {
	TransformerText                // the (positive) prompt
	ImageEmbeddings      TensorRef // SigLIP last_hidden_state [1, 729, 1152]
	CleanLatents         TensorRef // [1, 16, T1, h, w]
	CleanLatentIndices   []int64   // [T1]
	CleanLatents2x       TensorRef // [1, 16, T2, h, w]
	CleanLatent2xIndices []int64   // [T2]
	CleanLatents4x       TensorRef // [1, 16, T4, h, w]
	CleanLatent4xIndices []int64   // [T4]
	LatentIndices        []int64   // frame indices of the noisy latents [T]
}

// TransformerSectionRequest samples one section's latents with the packed transformer.
type TransformerSectionRequest struct {
	TransformerConditioning
	Negative          TransformerText // the negative prompt; read only with real CFG (CFG ≠ 1)
	Steps             uint32
	CFG               float32
	GS                float32
	RS                float32
	Shift             *float32 // nil: computed from the sequence length
	UseTeaCache       bool
	TeaCacheThreshold float32
	Sampler           SamplerVariant
	GeneratorState    []byte
	Seed              int64
	Width             uint32
	Height            uint32
	Frames            uint32
	Latents           TensorRef
	StepPreviews      []TensorRef
	MagCache          *MagCacheSettings // nil: MagCache off
}

// MagCacheCalibration names the magnitude-ratio table MagCache reads (worker.proto
// MagCacheCalibration).
type MagCacheCalibration int32

// Calibrations (worker.proto MagCacheCalibration).
const (
	MagCacheUnspecified MagCacheCalibration = 0
	MagCacheFramePack   MagCacheCalibration = 1 // FramePack's i2v transformer
	MagCacheFramePackF1 MagCacheCalibration = 2 // the FramePack-F1 transformer
)

// MagCacheSettings are a section's MagCache settings (worker.proto MagCacheSettings); zero
// Threshold and MaxConsecutiveSkips and a nil RetentionRatio mean the defaults.
type MagCacheSettings struct {
	Calibration         MagCacheCalibration
	Threshold           float64
	MaxConsecutiveSkips uint32
	RetentionRatio      *float64
}

// TransformerForwardRequest runs one forward of the packed transformer (batch 1) and writes the
// predicted flow velocity. ImageEmbeddings is needed when the model has an image projection.
type TransformerForwardRequest struct {
	HiddenStates TensorRef // noisy latents [1, C, T, h, w]
	Timestep     float32   // σ·1000
	Guidance     float32   // gs·1000
	TransformerConditioning
	Velocity TensorRef // output, hidden_states' shape
}

// Progress reports where a stage is.
type Progress struct {
	Phase      string
	Step       uint32
	TotalSteps uint32
	Elapsed    time.Duration
}

// StepPreview says a preview tensor has been written.
type StepPreview struct {
	Step     uint32
	Denoised TensorRef
}

// ConvFallback reports one tier decision for one convolution shape.
type ConvFallback struct {
	ShapeKey string
	Tier     ConvTier
	Outcome  ConvOutcome
	Detail   string
}

// LogLevel is the severity of a LogLine.
type LogLevel int32

// Log levels (worker.proto LogLevel).
const (
	LogUnspecified LogLevel = 0
	LogDebug       LogLevel = 1
	LogInfo        LogLevel = 2
	LogWarn        LogLevel = 3
	LogError       LogLevel = 4
)

// LogLine is one structured log line from the worker.
type LogLine struct {
	Level   LogLevel
	Message string
	Fields  map[string]string
}

// Result ends a successful stage.
type Result struct {
	Outputs        []TensorRef
	Stats          *Stats
	GeneratorState []byte
	VAETiling      *VAETilingUsed // VAE stages: the tiling run
	// CacheSkippedSteps are the sampling steps (0-based) TeaCache or MagCache skipped, positive
	// branch (transformer sections).
	CacheSkippedSteps []uint32
}

// VAETilingUsed is the tiling a VAE stage ran with (worker.proto VaeTilingUsed).
type VAETilingUsed struct {
	Tiling            VAETiling // every size filled in
	Chosen            bool      // chosen by the worker from its memory cap (the request left it unset)
	PeakEstimateBytes uint64    // estimated peak of one tile above the weights
	BudgetBytes       uint64    // what the cap left beside the weights; 0: no cap
	Runs              uint32    // model runs per batch sample
}

// ErrorCode classifies a failed call for the supervisor's recovery.
type ErrorCode int32

// Error codes (worker.proto ErrorCode).
const (
	CodeUnspecified     ErrorCode = 0
	CodeOutOfMemory     ErrorCode = 1
	CodeDeviceLost      ErrorCode = 2
	CodeInvalidArgument ErrorCode = 3
	CodeInternal        ErrorCode = 4
	CodeCancelled       ErrorCode = 5
)

var codeNames = map[ErrorCode]string{
	CodeUnspecified: "unspecified", CodeOutOfMemory: "out of memory", CodeDeviceLost: "device lost",
	CodeInvalidArgument: "invalid argument", CodeInternal: "internal", CodeCancelled: "cancelled",
}

// String returns the code's lower-case name.
func (c ErrorCode) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return fmt.Sprintf("code(%d)", int32(c))
}

// Error is a classified failure of a worker call. Workers return it (possibly wrapped) to choose
// the code the supervisor sees; the supervisor gets it back from Process calls.
type Error struct {
	Code           ErrorCode
	Message        string
	RequestedBytes uint64 // CodeOutOfMemory only
	AvailableBytes uint64 // CodeOutOfMemory only
	// Traits is what the model has that a retry can change, on a Load that ran out of memory
	// (TraitsDeclarer); nil otherwise.
	Traits *ModelTraits
}

// TraitsDeclarer is a worker that knows its model's traits before a Load succeeds: its Load's
// out-of-memory errors carry them (Error.Traits), so that the supervisor's ladder can step
// down for a model whose weights never fitted.
type TraitsDeclarer interface {
	// Traits returns the model's traits as far as the worker knows them (a stack's length
	// only once a Load read it).
	Traits() *ModelTraits
}

// TraitsOf returns the model traits an error carries (a Load that ran out of memory), or nil.
func TraitsOf(err error) *ModelTraits {
	var we *Error
	if errors.As(err, &we) {
		return we.Traits
	}
	return nil
}

// Error returns the message; the code is in Code.
func (e *Error) Error() string { return e.Message }

// Errorf returns an *Error with code and a formatted message.
func Errorf(code ErrorCode, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrInvalidArgument marks an error that is the request's fault (a missing field, a tensor of
// the wrong shape); CodeOf gives an error wrapping it CodeInvalidArgument. Wrap it with what is
// wrong, or use InvalidArgumentf.
var ErrInvalidArgument = errors.New("invalid argument")

// InvalidArgumentf returns an error wrapping ErrInvalidArgument: "invalid argument: " and the
// formatted message (which may wrap errors with %w).
func InvalidArgumentf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

// CodeOf classifies err: the code of the *Error it wraps, CodeInvalidArgument for
// ErrInvalidArgument, CodeCancelled for a cancelled or expired context, CodeInternal otherwise
// (CodeUnspecified for nil).
func CodeOf(err error) ErrorCode {
	var we *Error
	switch {
	case err == nil:
		return CodeUnspecified
	case errors.As(err, &we):
		return we.Code
	case errors.Is(err, ErrInvalidArgument):
		return CodeInvalidArgument
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return CodeCancelled
	}
	return CodeInternal
}

// asError returns err as an *Error, classifying it with CodeOf when it is not one.
func asError(err error) *Error {
	var we *Error
	if errors.As(err, &we) {
		if err.Error() == we.Error() {
			return we
		}
		out := *we // keep the wrapping context in the message
		out.Message = err.Error()
		return &out
	}
	return &Error{Code: CodeOf(err), Message: err.Error()}
}

// IsZero reports whether t declares nothing (not reported).
func (t ModelTraits) IsZero() bool {
	return t.BlockStack == "" && t.Blocks == 0 && !t.Convolves && !t.Tiles && len(t.FallbackDTypes) == 0
}
