package pipeline

import (
	"fmt"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
)

// magCacheCalibration is the MagCache table of a sampling variant's transformer: FramePack's
// for the i2v loops, FramePack-F1's for the F1 loops (FramePack-Studio's worker.py picks
// "F1" when the model type names F1, else "Original").
func magCacheCalibration(variant string) workerkit.MagCacheCalibration {
	if variantTransformer(variant) == VariantF1 {
		return workerkit.MagCacheFramePackF1
	}
	return workerkit.MagCacheFramePack
}

// variantTransformer is the transformer family a variant samples with: VariantF1 or
// VariantI2V.
func variantTransformer(variant string) string {
	if variant == VariantF1 || variant == VariantVideoF1 {
		return VariantF1
	}
	return VariantI2V
}

// magCache is the transformer request's MagCache settings: nil unless the job's cache is
// MagCache.
func (j *jobRun) magCache() *workerkit.MagCacheSettings {
	spec := j.job.Spec
	if plan.SpecCache(spec) != plan.CacheMagCache {
		return nil
	}
	m := &workerkit.MagCacheSettings{Calibration: magCacheCalibration(j.variant.Name()), Threshold: spec.GetMagcacheThreshold(),
		MaxConsecutiveSkips: spec.GetMagcacheMaxConsecutiveSkips()}
	if spec.MagcacheRetentionRatio != nil {
		r := spec.GetMagcacheRetentionRatio()
		m.RetentionRatio = &r
	}
	return m
}

// logCacheSkips logs which steps of section i the job's step cache skipped.
func (j *jobRun) logCacheSkips(i int, res *workerkit.Result) {
	cache := plan.SpecCache(j.job.Spec)
	if cache == plan.CacheNone || res == nil {
		return
	}
	j.log.WithFields(logrus.Fields{"section": i, "cache": cache, "skipped_steps": fmt.Sprint(res.CacheSkippedSteps),
		"skipped": len(res.CacheSkippedSteps), "steps": j.steps}).Info("step cache")
}
