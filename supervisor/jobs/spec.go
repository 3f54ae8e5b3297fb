package jobs

import (
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
	"google.golang.org/protobuf/proto"
)

// Defaults of JobSpec fields whose zero value (or absence) means "the documented default";
// they are FramePack's demo_gradio.py defaults (supervisor/pipeline/plan, which clients may
// import). DefaultResolution is FramePack's models' own; the API gives the served models' own.
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
)

// Step caches (JobSpec.cache).
const (
	CacheNone     = "none"
	CacheTeaCache = "teacache"
	CacheMagCache = "magcache"
)

// Caches lists the step caches a spec may name.
var Caches = []string{CacheNone, CacheTeaCache, CacheMagCache}

// SpecCache is the step cache a spec asks for: JobSpec.cache, or, when it is empty,
// use_teacache's (unset meaning true).
func SpecCache(spec *framepackv1.JobSpec) string {
	if c := spec.GetCache(); c != "" {
		return c
	}
	if spec.UseTeacache == nil || spec.GetUseTeacache() {
		return CacheTeaCache
	}
	return CacheNone
}

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
	s.Cache = SpecCache(s)
	s.UseTeacache = proto.Bool(s.Cache == CacheTeaCache)
	if s.Cache == CacheMagCache {
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
	return s
}
