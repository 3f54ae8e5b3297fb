package imageproc

import (
	"fmt"
	"slices"
)

// Bucket is a (height, width) training resolution of FramePack.
type Bucket struct{ Height, Width int }

// buckets640 is bucket_options[640] of FramePack's diffusers_helper/bucket_tools.py, in its order
// (the order matters: ties go to the later bucket).
var buckets640 = []Bucket{
	{416, 960}, {448, 864}, {480, 832}, {512, 768}, {544, 704}, {576, 672}, {608, 640},
	{640, 608}, {672, 576}, {704, 544}, {768, 512}, {832, 480}, {864, 448}, {960, 416},
}

// BucketTable returns FramePack's bucket list for a resolution (only 640 exists upstream) and
// whether there is one. The slice is a copy.
func BucketTable(resolution int) ([]Bucket, bool) {
	switch resolution {
	case 640:
		return slices.Clone(buckets640), true
	}
	return nil, false
}

// FindNearestBucket is FramePack's find_nearest_bucket over table: the bucket minimising
// |h·bw − w·bh| (aspect-ratio mismatch scaled by both areas), the last one on a tie.
func FindNearestBucket(h, w int, table []Bucket) (Bucket, error) {
	if len(table) == 0 {
		return Bucket{}, fmt.Errorf("find nearest bucket: empty bucket table")
	}
	var best Bucket
	bestMetric := int64(-1)
	for _, b := range table {
		d := int64(h)*int64(b.Width) - int64(w)*int64(b.Height)
		if d < 0 {
			d = -d
		}
		if bestMetric < 0 || d <= bestMetric {
			bestMetric, best = d, b
		}
	}
	return best, nil
}
