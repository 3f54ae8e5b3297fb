package plan

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// The bounds of a job, in one table: the API refuses a submitted spec outside them (with the
// field and the range), and the pipeline checks a stored spec against them again before it
// runs it (a job stored by another version, or written by hand).
const (
	// MaxSecondLength bounds total_second_length: (0, MaxSecondLength] seconds.
	MaxSecondLength = 120
	// MinLatentWindowSize and MaxLatentWindowSize bound latent_window_size.
	MinLatentWindowSize, MaxLatentWindowSize = 1, 33
	// MinSteps and MaxSteps bound steps.
	MinSteps, MaxSteps = 1, 100
	// MaxMP4CRF bounds mp4_crf (x264's scale).
	MaxMP4CRF = 51
	// MaxGPUMemoryPreservationGB bounds gpu_memory_preservation_gb.
	MaxGPUMemoryPreservationGB = 128
	// MaxKeepAlive bounds keep_alive: a day.
	MaxKeepAlive = 24 * time.Hour
	// DefaultMaxImagePixels is the largest start or end image (width × height) a daemon takes
	// unless told otherwise (framepackd --max-image-pixels): the API checks it from the
	// header before decoding and the pipeline's decoder holds the job's images to the same.
	DefaultMaxImagePixels = 40_000_000
	// MaxKeyframes bounds JobSpec.keyframes.
	MaxKeyframes = 32
	// MinMagCacheThreshold and MaxMagCacheThreshold bound magcache_threshold, MinMagCacheSkips
	// and MaxMagCacheSkips magcache_max_consecutive_skips, MaxMagCacheRetentionRatio
	// magcache_retention_ratio (from 0): FramePack-Studio's sliders.
	MinMagCacheThreshold, MaxMagCacheThreshold = 0.01, 1.0
	MinMagCacheSkips, MaxMagCacheSkips         = 1, 5
	MaxMagCacheRetentionRatio                  = 1.0
	// MinVideoContextFrames (MinVideoContextFramesF1 for the f1 variant: Studio's Video F1
	// cannot run 1, its clean latents and indices disagree) and MaxVideoContextFrames bound
	// video_context_frames (Studio's slider).
	MinVideoContextFrames, MinVideoContextFramesF1, MaxVideoContextFrames = 1, 2, 10
	// The input videos a job may extend, unless the daemon says otherwise (framepackd
	// --max-video-bytes, --max-video-seconds, --max-video-frames, --max-video-pixels): 256 MiB,
	// 2 minutes, 3600 frames, frames of at most 4096×2304 pixels.
	DefaultMaxVideoBytes   = 256 << 20
	DefaultMaxVideoSeconds = 120
	DefaultMaxVideoFrames  = 3600
	DefaultMaxVideoPixels  = 4096 * 2304
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
// use_teacache's (unset meaning true). A stored spec names both (api.WithDefaults), so this
// reads it as stored.
func SpecCache(spec *framepackv1.JobSpec) string {
	if c := spec.GetCache(); c != "" {
		return c
	}
	if spec.UseTeacache == nil || spec.GetUseTeacache() {
		return CacheTeaCache
	}
	return CacheNone
}

// CheckCache checks JobSpec.cache and MagCache's settings against the table: a known cache, a
// use_teacache that does not contradict it, and MagCache settings within their ranges, only
// with MagCache.
func CheckCache(s *framepackv1.JobSpec) []Violation {
	var v []Violation
	add := func(field, format string, args ...any) {
		v = append(v, Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	c := s.GetCache()
	if c != "" && !slices.Contains(Caches, c) {
		add("spec.cache", "unknown cache %q (want %s, or empty for use_teacache's choice)", c, strings.Join(Caches, ", "))
		return v
	}
	if c != "" && s.UseTeacache != nil && s.GetUseTeacache() != (c == CacheTeaCache) {
		add("spec.use_teacache", "%v contradicts spec.cache %q: leave use_teacache unset and name the cache in spec.cache", s.GetUseTeacache(), c)
	}
	if SpecCache(s) != CacheMagCache {
		for _, f := range []struct {
			name string
			set  bool
		}{{"magcache_threshold", s.MagcacheThreshold != nil}, {"magcache_max_consecutive_skips", s.MagcacheMaxConsecutiveSkips != nil},
			{"magcache_retention_ratio", s.MagcacheRetentionRatio != nil}} {
			if f.set {
				add("spec."+f.name, "set without spec.cache \"magcache\": set the cache too, or leave it unset")
			}
		}
		return v
	}
	if s.MagcacheThreshold != nil {
		if t := s.GetMagcacheThreshold(); math.IsNaN(t) || t < MinMagCacheThreshold || t > MaxMagCacheThreshold {
			add("spec.magcache_threshold", "must be %g to %g (unset means %g), got %g", MinMagCacheThreshold, MaxMagCacheThreshold, DefaultMagCacheThreshold, t)
		}
	}
	if s.MagcacheMaxConsecutiveSkips != nil {
		if k := s.GetMagcacheMaxConsecutiveSkips(); k < MinMagCacheSkips || k > MaxMagCacheSkips {
			add("spec.magcache_max_consecutive_skips", "must be %d to %d (unset means %d), got %d", MinMagCacheSkips, MaxMagCacheSkips, DefaultMagCacheMaxSkips, k)
		}
	}
	if s.MagcacheRetentionRatio != nil {
		if r := s.GetMagcacheRetentionRatio(); math.IsNaN(r) || r < 0 || r > MaxMagCacheRetentionRatio {
			add("spec.magcache_retention_ratio", "must be 0 to %g (unset means %g), got %g", MaxMagCacheRetentionRatio, DefaultMagCacheRetentionRatio, r)
		}
	}
	return v
}

// extendsVideo reports whether a spec, submitted or stored, extends a video.
func extendsVideo(s *framepackv1.JobSpec) bool {
	return len(s.GetInputVideo()) > 0 || s.GetInputVideoSha256() != "" || s.GetInputVideoJobId() != ""
}

// CheckVideoContextFrames checks JobSpec.video_context_frames, when it is set, against the
// variant's range.
func CheckVideoContextFrames(s *framepackv1.JobSpec) []Violation {
	if s.VideoContextFrames == nil {
		return nil
	}
	k, lo, variant := s.GetVideoContextFrames(), uint32(MinVideoContextFrames), s.GetVariant()
	if variant == "f1" {
		lo = MinVideoContextFramesF1
	}
	if variant == "" {
		variant = "i2v"
	}
	if k < lo || k > MaxVideoContextFrames {
		return []Violation{{Field: "spec.video_context_frames", Description: fmt.Sprintf("must be %d to %d for the %s variant (unset means %d), got %d",
			lo, MaxVideoContextFrames, variant, DefaultVideoContextFrames, k)}}
	}
	return nil
}

// CheckRun checks what the section loop relies on in a spec with every default filled in:
// the window, the step count, the step cache's settings and the video context within the
// table's bounds.
func CheckRun(spec *framepackv1.JobSpec) error {
	if w := spec.GetLatentWindowSize(); w < MinLatentWindowSize || w > MaxLatentWindowSize {
		return fmt.Errorf("latent_window_size %d (%d to %d)", w, MinLatentWindowSize, MaxLatentWindowSize)
	}
	if n := spec.GetSteps(); n < MinSteps || n > MaxSteps {
		return fmt.Errorf("steps %d (%d to %d)", n, MinSteps, MaxSteps)
	}
	if extendsVideo(spec) && spec.VideoContextFrames == nil {
		return fmt.Errorf("video_context_frames unset in a job that extends a video (a spec without its defaults)")
	}
	for _, v := range append(CheckCache(spec), CheckVideoContextFrames(spec)...) {
		return fmt.Errorf("%s: %s", v.Field, v.Description)
	}
	return nil
}
