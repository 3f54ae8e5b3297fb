package main

// framepack pull: download the pipeline's models from the Hugging Face hub into the hub's
// cache layout (internal/hfhub), standalone (no daemon needed).
//
//	framepack pull [--variant i2v|f1|i2v,f1] [--cache DIR] [--revision main] [--jobs 4] [--quiet]
//
// The cache is --cache (a hub cache, or a HF_HOME such as FramePack's hf_download/, whose hub/
// is then used), else $HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub. HF_ENDPOINT,
// HF_TOKEN and HF_HUB_OFFLINE are read as huggingface_hub reads them. On success the cache
// folder is printed on stdout (give it to framepackd --models). Exit status: 0 done, 1 failed
// (network, checksum, disk), 2 bad command line, 4 refused by the hub (401/403: set HF_TOKEN),
// 5 not found (404).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/framepackd/framepackd/internal/hfhub"
)

// hubFlags are the flags of pull and models.
type hubFlags struct {
	cache    string
	revision string
}

func newHubFlags(name string, e *env, h *hubFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("framepack "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.StringVar(&h.cache, "cache", "", "Hugging Face cache folder, or a HF_HOME such as FramePack's hf_download/ (default $HF_HUB_CACHE, ~/.cache/huggingface/hub)")
	fs.StringVar(&h.revision, "revision", hfhub.DefaultRevision, "branch, tag or commit of every repository")
	return fs
}

// cacheDir is the hub cache the flags name.
func (h *hubFlags) cacheDir(env hfhub.Env) string {
	if h.cache != "" {
		return hfhub.CacheRoot(h.cache)
	}
	return env.Cache
}

// hubExit maps a pull error to an exit status.
func hubExit(err error) error {
	switch {
	case errors.Is(err, hfhub.ErrUnauthorized):
		return fail(exitRejected, "%v", err)
	case errors.Is(err, hfhub.ErrNotFound):
		return fail(exitNotFound, "%v", err)
	}
	return fail(exitError, "%v", err)
}

func cmdPull(ctx context.Context, e *env, args []string) error {
	var h hubFlags
	fs := newHubFlags("pull", e, &h)
	variants := fs.String("variant", "i2v", "pipelines to pull, comma-separated: "+strings.Join(hfhub.VariantNames(), ", "))
	jobs := fs.Int("jobs", 4, "files downloaded at once")
	quiet := fs.Bool("quiet", false, "no progress output")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fail(exitUsage, "pull: unexpected arguments %q", pos)
	}
	if *jobs < 1 {
		return fail(exitUsage, "pull: --jobs must be at least 1")
	}
	var names []string
	for _, v := range strings.Split(*variants, ",") {
		if v = strings.TrimSpace(v); v != "" {
			names = append(names, v)
		}
	}
	wants, err := hfhub.Wants(names, h.revision)
	if err != nil || len(wants) == 0 {
		return fail(exitUsage, "pull: --variant %q: want %s", *variants, strings.Join(hfhub.VariantNames(), ", "))
	}
	env := hfhub.FromEnv()
	cache := h.cacheDir(env)

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	d := newPullDisplay(e, *quiet)
	p := &hfhub.Puller{Client: hfhub.NewClient(env), Cache: hfhub.Cache{Root: cache}, Offline: env.Offline,
		Concurrency: *jobs, Progress: d.update}
	p.Client.UserAgent = "framepack-pull"
	if !*quiet {
		where := env.Endpoint
		if env.Offline {
			where = "the cache only (HF_HUB_OFFLINE)"
		}
		fmt.Fprintf(e.stderr, "pulling %s from %s into %s\n", strings.Join(names, ", "), where, cache)
	}
	plan, err := p.Plan(ctx, wants)
	if err != nil {
		return hubExit(err)
	}
	if !*quiet {
		describePlan(e.stderr, plan)
	}
	err = p.Pull(ctx, plan)
	d.finish()
	if err != nil {
		return hubExit(err)
	}
	if !*quiet {
		fmt.Fprintf(e.stderr, "done: %s in %s; start the daemon with --models %s\n", hfhub.Bytes(plan.Total), cache, cache)
	}
	fmt.Fprintln(e.stdout, cache)
	return nil
}

// describePlan prints what each repository needs.
func describePlan(w io.Writer, plan *hfhub.Plan) {
	for _, r := range plan.Repos {
		var files, present int
		var need int64
		for _, it := range plan.Items {
			if it.Repo != r.Repo {
				continue
			}
			files++
			if it.Present || it.BlobPresent {
				present++
			} else {
				need += it.Size - it.Have
			}
		}
		state := "complete"
		if present < files {
			state = fmt.Sprintf("%s to download", hfhub.Bytes(need))
		}
		fmt.Fprintf(w, "  %s @ %s (%s): %d files, %s\n", r.Repo, shortCommit(r.Commit), r.Revision, files, state)
	}
}

func shortCommit(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}

// pullDisplay draws a pull's progress: on a terminal, a bar per file being downloaded and one
// for the total, redrawn in place at most every redrawEvery; otherwise a line per finished
// file and the total every plainEvery.
type pullDisplay struct {
	mu       sync.Mutex // mu protects the fields below (Progress reports are serialised, finish is not)
	w        io.Writer
	tty      bool
	quiet    bool
	width    func() int
	now      func() time.Time
	active   map[string]hfhub.Progress
	last     hfhub.Progress
	lines    int // lines drawn last time (terminal)
	drawn    time.Time
	reported time.Time
}

const (
	redrawEvery = 100 * time.Millisecond
	plainEvery  = 10 * time.Second
)

func newPullDisplay(e *env, quiet bool) *pullDisplay {
	return &pullDisplay{w: e.stderr, tty: e.stderrTTY, quiet: quiet, width: e.width, now: time.Now, active: map[string]hfhub.Progress{}}
}

func (d *pullDisplay) update(p hfhub.Progress) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.quiet {
		return
	}
	d.last = p
	key := p.Repo + "/" + p.Path
	switch p.State {
	case hfhub.FileDownloading, hfhub.FileVerifying:
		d.active[key] = p
	case hfhub.FileDone, hfhub.FileFailed, hfhub.FileQueued:
		_, wasActive := d.active[key]
		delete(d.active, key)
		if p.State == hfhub.FileFailed {
			d.above(fmt.Sprintf("failed %s: %v", key, p.Err))
		} else if p.State == hfhub.FileDone && wasActive {
			d.above(fmt.Sprintf("done   %s (%s)", key, hfhub.Bytes(p.Size)))
		}
	}
	now := d.now()
	if d.tty {
		if now.Sub(d.drawn) >= redrawEvery || p.State != hfhub.FileDownloading {
			d.draw()
			d.drawn = now
		}
		return
	}
	if now.Sub(d.reported) >= plainEvery {
		d.reported = now
		fmt.Fprintf(d.w, "total %s / %s, %d/%d files\n", hfhub.Bytes(p.TotalDone), hfhub.Bytes(p.Total), p.FilesDone, p.Files)
	}
}

// above prints a line that stays, above the bars on a terminal.
func (d *pullDisplay) above(s string) {
	if d.tty {
		d.clear()
	}
	fmt.Fprintln(d.w, s)
	if d.tty {
		d.draw()
	}
}

func (d *pullDisplay) clear() {
	for range d.lines {
		fmt.Fprint(d.w, "\033[1A\r\033[K")
	}
	d.lines = 0
}

func (d *pullDisplay) draw() {
	d.clear()
	width := 80
	if d.width != nil {
		if w := d.width(); w > 30 {
			width = w
		}
	}
	keys := make([]string, 0, len(d.active))
	for k := range d.active {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p := d.active[k]
		label := k
		if p.State == hfhub.FileVerifying {
			label = "verifying " + label
		}
		fmt.Fprintln(d.w, barLine(label, p.Done, p.Size, width))
		d.lines++
	}
	p := d.last
	fmt.Fprintln(d.w, barLine(fmt.Sprintf("total (%d/%d files)", p.FilesDone, p.Files), p.TotalDone, p.Total, width))
	d.lines++
}

// barLine is "label [####----] 1.2 GiB / 3.4 GiB" fitted to width (labels over 40 characters
// keep their end).
func barLine(label string, done, total int64, width int) string {
	const labelWidth = 40
	frac := 1.0
	if total > 0 {
		frac = min(max(float64(done)/float64(total), 0), 1)
	}
	if r := []rune(label); len(r) > labelWidth {
		label = "…" + string(r[len(r)-labelWidth+1:])
	}
	label += strings.Repeat(" ", labelWidth-len([]rune(label)))
	tail := fmt.Sprintf(" %s / %s", hfhub.Bytes(done), hfhub.Bytes(total))
	barLen := min(30, width-len(tail)-labelWidth-4)
	if barLen < 5 {
		return strings.TrimRight(label, " ") + tail
	}
	return label + " " + bar(frac, barLen) + tail
}

// finish ends the display (the bars are left as they are).
func (d *pullDisplay) finish() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.quiet || d.tty {
		return
	}
	p := d.last
	if p.Files > 0 {
		fmt.Fprintf(d.w, "total %s / %s, %d/%d files\n", hfhub.Bytes(p.TotalDone), hfhub.Bytes(p.Total), p.FilesDone, p.Files)
	}
}
