package main

// The daemon's limits: disk (retention, budget, free space, section videos), images, and the
// readiness check that health and SubmitJob follow.

import (
	"flag"

	"fmt"
	"github.com/framepackd/framepackd/supervisor/api"
	"strconv"
	"strings"
	"time"
)

// limitOptions are the flags that bound what the daemon keeps and accepts.
type limitOptions struct {
	retentionAge   time.Duration
	retentionBytes byteSize
	diskBudget     byteSize
	minFree        byteSize
	keepVideos     bool
	socketGroup    string
	maxPixels      int64
	maxDecodes     int
	// The input videos a job may extend.
	maxVideoBytes   byteSize
	maxVideoSeconds float64
	maxVideoFrames  int
	maxVideoPixels  int
}

// addLimitFlags registers the limit flags on fs.
func addLimitFlags(fs *flag.FlagSet) *limitOptions {
	l := &limitOptions{minFree: 1 << 30}
	fs.DurationVar(&l.retentionAge, "retention-age", 0, "delete finished jobs (record, input, videos) this long after they ended, e.g. 168h; 0 keeps them")
	fs.Var(&l.retentionBytes, "retention-bytes", "delete the oldest finished jobs while all job folders together hold more than this, e.g. 50GiB; 0 keeps them")
	fs.Var(&l.diskBudget, "disk-budget", "refuse a job at submit when the job folders plus what the unfinished jobs and this one will write would exceed this, e.g. 100GiB; 0: no budget")
	fs.Var(&l.minFree, "min-free-disk", "refuse a job at submit that would leave less than this free on the state directory's disk; 0 turns the check off")
	fs.Int64Var(&l.maxPixels, "max-image-pixels", api.MaxImagePixels, "refuse submitted images with more pixels than this (width × height, read from the header before decoding)")
	fs.IntVar(&l.maxDecodes, "max-concurrent-decodes", api.DefaultMaxConcurrentDecodes, "decode at most this many submitted images at once (each takes about 7 bytes a pixel while it is checked); others wait")
	l.maxVideoBytes = api.DefaultMaxVideoBytes
	fs.Var(&l.maxVideoBytes, "max-video-bytes", fmt.Sprintf("refuse input videos (to extend) larger than this, at most %d MiB", api.MaxRequestBytes>>20))
	fs.Float64Var(&l.maxVideoSeconds, "max-video-seconds", api.DefaultVideoLimits.MaxSeconds, "refuse input videos longer than this, in seconds")
	fs.IntVar(&l.maxVideoFrames, "max-video-frames", api.DefaultVideoLimits.MaxFrames, "refuse input videos of more frames than this")
	fs.IntVar(&l.maxVideoPixels, "max-video-pixels", api.DefaultVideoLimits.MaxPixels, "refuse input videos whose frames have more pixels than this (width × height)")
	fs.StringVar(&l.socketGroup, "socket-group", "", "give the unix socket to this group with mode 0660, so its members can use the daemon (default: 0600, this user only)")
	fs.BoolVar(&l.keepVideos, "keep-section-videos", false, "keep every section's MP4, not only the newest (each holds all frames of the one before)")
	return l
}

// byteSize is a flag of bytes: a number with an optional unit (B, KB, MB, GB, TB in powers
// of 1000; KiB, MiB, GiB, TiB in powers of 1024).
type byteSize int64

// String prints the size in bytes.
func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

// Set parses "50GiB", "1.5GB", "1048576".
func (b *byteSize) Set(s string) error {
	n, err := parseBytes(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1}}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(u.suffix)) {
			t, mult = strings.TrimSpace(t[:len(t)-len(u.suffix)]), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || f*mult > 1<<62 {
		return 0, fmt.Errorf("%q is not a size (e.g. 500MiB, 20GB, 1073741824)", s)
	}
	return int64(f * mult), nil
}
