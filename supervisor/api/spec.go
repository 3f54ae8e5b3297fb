package api

import (
	"google.golang.org/protobuf/proto"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
)

// Defaults of JobSpec fields whose zero value (or absence) means "the documented default";
// they are FramePack's demo_gradio.py defaults, declared in supervisor/pipeline/plan (which
// clients may import) and applied once, here at the API edge (Server.withDefaults, before a spec
// is validated and stored): the queue, the store and the pipeline see only specs with every
// default filled in. DefaultResolution is FramePack's models' own; the API gives the served
// models' own.
const (
	DefaultLatentWindowSize        = plan.DefaultLatentWindowSize
	DefaultSteps                   = plan.DefaultSteps
	DefaultCFG                     = plan.DefaultCFG
	DefaultGS                      = plan.DefaultGS
	DefaultResolution              = plan.FramePackResolution
	DefaultMP4CRF                  = plan.DefaultMP4CRF
	DefaultGPUMemoryPreservationGB = plan.DefaultGPUMemoryPreservationGB
	DefaultUseTeaCache             = plan.DefaultUseTeaCache
	DefaultLoraStrength            = plan.DefaultLoraStrength
	DefaultEndStrength             = plan.DefaultEndStrength
	DefaultSeed                    = plan.DefaultSeed
	DefaultMagCacheThreshold       = plan.DefaultMagCacheThreshold
	DefaultMagCacheMaxSkips        = plan.DefaultMagCacheMaxSkips
	DefaultMagCacheRetentionRatio  = plan.DefaultMagCacheRetentionRatio
	DefaultVideoContextFrames      = plan.DefaultVideoContextFrames
	DefaultVideoIncludeInput       = plan.DefaultVideoIncludeInput
)

// WithDefaults returns a copy of spec with every default filled in, as the Job stores it.
func WithDefaults(spec *framepackv1.JobSpec) *framepackv1.JobSpec {
	s := proto.Clone(spec).(*framepackv1.JobSpec)
	if s.Seed == nil {
		s.Seed = proto.Int64(DefaultSeed)
	}
	if s.LatentWindowSize == 0 {
		s.LatentWindowSize = DefaultLatentWindowSize
	}
	if s.Steps == 0 {
		s.Steps = DefaultSteps
	}
	if s.Cfg == 0 {
		s.Cfg = DefaultCFG
	}
	if s.Gs == 0 {
		s.Gs = DefaultGS
	}
	if s.Resolution == 0 {
		s.Resolution = DefaultResolution
	}
	// The cache is named once: cache, with use_teacache saying the same.
	s.Cache = plan.SpecCache(s)
	s.UseTeacache = proto.Bool(s.Cache == plan.CacheTeaCache)
	if s.Cache == plan.CacheMagCache {
		if s.MagcacheThreshold == nil {
			s.MagcacheThreshold = proto.Float64(DefaultMagCacheThreshold)
		}
		if s.MagcacheMaxConsecutiveSkips == nil {
			s.MagcacheMaxConsecutiveSkips = proto.Uint32(DefaultMagCacheMaxSkips)
		}
		if s.MagcacheRetentionRatio == nil {
			s.MagcacheRetentionRatio = proto.Float64(DefaultMagCacheRetentionRatio)
		}
	}
	if s.Mp4Crf == nil {
		s.Mp4Crf = proto.Uint32(DefaultMP4CRF)
	}
	for _, l := range s.Loras {
		if l.Strength == 0 {
			l.Strength = DefaultLoraStrength
		}
	}
	if s.GpuMemoryPreservationGb == nil {
		s.GpuMemoryPreservationGb = proto.Float32(DefaultGPUMemoryPreservationGB)
	}
	if len(s.EndImage) > 0 && s.EndStrength == nil {
		s.EndStrength = proto.Float32(DefaultEndStrength)
	}
	if extendsVideo(s) {
		if s.VideoContextFrames == nil {
			s.VideoContextFrames = proto.Uint32(DefaultVideoContextFrames)
		}
		if s.VideoIncludeInput == nil {
			s.VideoIncludeInput = proto.Bool(DefaultVideoIncludeInput)
		}
	}
	return s
}
