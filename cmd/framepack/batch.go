package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"google.golang.org/protobuf/proto"
)

// batchItem is one job of a batch: its image file and its own settings flags.
type batchItem struct {
	where string   // "photos/a.png" or "list.csv line 3", for messages
	image string   // path
	args  []string // --name=value settings of its own
}

// cmdBatch is `framepack batch SOURCE [settings flags] [--batch-id ID] [--out-dir DIR] [--detach]`
// (SOURCE a folder of images, a .csv or a .jsonl file) and `framepack batch status|watch|cancel ID`.
func cmdBatch(ctx context.Context, e *env, args []string) error {
	switch sub, rest := subcommand(args); sub {
	case "status", "watch", "cancel":
		return batchByID(ctx, e, sub, rest)
	}
	var c common
	fs := newFlags("batch", e, &c)
	var (
		sf                   specFlags
		batchID, outDir      string
		detach, quiet, force bool
	)
	sf.register(fs)
	fs.StringVar(&batchID, "batch-id", "", "the batch's id (default: made from SOURCE's path, so running the same batch again adds no jobs)")
	fs.StringVar(&outDir, "out-dir", "", "save each finished video here, named after its image")
	fs.BoolVar(&detach, "detach", false, "submit, print the batch id and return")
	fs.BoolVar(&quiet, "quiet", false, "no progress output")
	fs.BoolVar(&force, "force", false, "with --out-dir: overwrite videos already there")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fail(exitUsage, "batch: want one SOURCE: a folder of images, a .csv or a .jsonl file (or: batch status|watch|cancel ID)")
	}
	src := pos[0]
	items, err := batchItems(src)
	if err != nil {
		return err
	}
	if batchID == "" {
		batchID = defaultBatchID(src)
	}
	// Each item's spec: the command line's settings, then the item's own.
	type job struct {
		item batchItem
		req  *framepackv1.SubmitJobRequest
	}
	var jobsToSend []job
	for _, it := range items {
		spec, err := itemSpec(&sf, it)
		if err != nil {
			return err
		}
		var img []byte
		if it.image != "" {
			if img, err = readImageFile(it.image, "image"); err != nil {
				return fail(exitCodeOf(err), "%s: %v", it.where, err)
			}
			spec.ImageFilename = filepath.Base(it.image)
		}
		spec.BatchId = batchID
		reqID, err := itemRequestID(batchID, img, spec)
		if err != nil {
			return err
		}
		jobsToSend = append(jobsToSend, job{it, &framepackv1.SubmitJobRequest{Image: img, Spec: spec, ClientRequestId: reqID}})
	}
	if outDir != "" {
		if err := os.MkdirAll(outDir, 0o755); err != nil {
			return fail(exitError, "--out-dir: %v", err)
		}
	}
	conn, err := dial(e, &c)
	if err != nil {
		return err
	}
	defer conn.Close()
	client := framepackv1.NewJobServiceClient(conn)
	d := newDisplay(e, quiet)
	names := map[string]string{} // job id → the item's image, for messages
	for i, j := range jobsToSend {
		job, err := submit(ctx, client, conn, j.req, c.timeout, d)
		if err != nil {
			code, msg := describeAt(err, conn)
			return fail(code, "batch %s: %s: %s\n(the items before it are submitted; run the same command again once it is mended: they are not submitted twice)", batchID, j.item.where, msg)
		}
		names[job.GetId()] = j.item.image
		if !quiet {
			fmt.Fprintf(e.stderr, "%d/%d %s: job %s (%s)\n", i+1, len(jobsToSend), j.item.where, job.GetId(), stateName(job.GetState()))
		}
	}
	if !quiet {
		fmt.Fprintf(e.stderr, "batch %s: %d jobs\n", batchID, len(jobsToSend))
	}
	if detach {
		fmt.Fprintln(e.stdout, batchID)
		return nil
	}
	return followBatch(ctx, e, &c, conn, batchID, names, outDir, force, quiet)
}

// batchByID is `framepack batch status|watch|cancel ID`.
func batchByID(ctx context.Context, e *env, sub string, args []string) error {
	var c common
	fs := newFlags("batch "+sub, e, &c)
	var reason, outDir string
	var force bool
	if sub == "cancel" {
		fs.StringVar(&reason, "reason", "", "why (recorded with each job)")
	}
	if sub == "watch" {
		fs.StringVar(&outDir, "out-dir", "", "save each finished video here, named after its image")
		fs.BoolVar(&force, "force", false, "with --out-dir: overwrite videos already there")
	}
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fail(exitUsage, "batch %s: want one batch id", sub)
	}
	conn, err := dial(e, &c)
	if err != nil {
		return err
	}
	defer conn.Close()
	bc := framepackv1.NewBatchServiceClient(conn)
	switch sub {
	case "cancel":
		cctx, cancel := context.WithTimeout(ctx, c.timeout)
		defer cancel()
		resp, err := bc.CancelBatch(cctx, &framepackv1.CancelBatchRequest{BatchId: pos[0], Reason: reason})
		if err != nil {
			return err
		}
		printBatch(e.stdout, resp.GetBatch())
		return nil
	case "watch":
		return followBatch(ctx, e, &c, conn, pos[0], nil, outDir, force, false)
	}
	cctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := bc.GetBatch(cctx, &framepackv1.GetBatchRequest{BatchId: pos[0]})
	if err != nil {
		return err
	}
	printBatch(e.stdout, resp.GetBatch())
	return nil
}

// printBatch prints a batch's counts and jobs.
func printBatch(w io.Writer, b *framepackv1.Batch) {
	fmt.Fprintf(w, "batch %s: %d jobs: %d queued, %d running, %d succeeded, %d failed, %d cancelled\n", b.GetBatchId(), len(b.GetJobs()),
		b.GetQueued(), b.GetRunning(), b.GetSucceeded(), b.GetFailed(), b.GetCancelled())
	for _, j := range b.GetJobs() {
		fmt.Fprintf(w, "  %s  %-9s  %s\n", j.GetId(), stateName(j.GetState()), j.GetSpec().GetImageFilename())
	}
}

// followBatch watches a batch to its end (Ctrl-C cancels it; a second leaves), prints how each
// job ended, saves the videos to outDir, and fails when a job did not succeed.
func followBatch(ctx context.Context, e *env, c *common, conn *server, id string, names map[string]string, outDir string, force, quiet bool) error {
	bc := framepackv1.NewBatchServiceClient(conn)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	sigs, stopSigs := e.signals()
	defer stopSigs()
	go func() {
		n := 0
		for {
			select {
			case sig := <-sigs:
				if sig == syscall.SIGTERM {
					stop()
					return
				}
				n++
				if n > 1 {
					stop()
					return
				}
				fmt.Fprintf(e.stderr, "\ncancelling batch %s (Ctrl-C again to leave without waiting)\n", id)
				cctx, cancel := context.WithTimeout(ctx, c.timeout)
				if _, err := bc.CancelBatch(cctx, &framepackv1.CancelBatchRequest{BatchId: id, Reason: "interrupted from the command line"}); err != nil {
					_, msg := describeAt(err, conn)
					fmt.Fprintln(e.stderr, "framepack: cancel: "+msg)
				}
				cancel()
			case <-wctx.Done():
				return
			}
		}
	}()
	stream, err := bc.WatchBatch(wctx, &framepackv1.WatchBatchRequest{BatchId: id})
	if err != nil {
		return err
	}
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if wctx.Err() != nil && ctx.Err() == nil {
				return fail(exitCancelled, "left batch %s; re-attach with: framepack batch watch %s", id, id)
			}
			return err
		}
		if quiet || ev.GetReplay() && ev.GetSnapshot() == nil && !isTerminalEvent(ev) {
			continue
		}
		who := ev.GetJobId()
		if n := names[who]; n != "" {
			who += " (" + filepath.Base(n) + ")"
		}
		switch {
		case ev.GetJobFinished() != nil:
			fmt.Fprintf(e.stderr, "job %s finished: %d frames\n", who, ev.GetJobFinished().GetResult().GetFrameCount())
		case ev.GetJobFailed() != nil:
			fmt.Fprintf(e.stderr, "job %s failed: %s\n", who, ev.GetJobFailed().GetFailure().GetMessage())
		case ev.GetJobCancelled() != nil:
			fmt.Fprintf(e.stderr, "job %s cancelled\n", who)
		case ev.GetSectionVideo() != nil && !ev.GetReplay():
			fmt.Fprintf(e.stderr, "job %s: section %d done\n", who, ev.GetSectionVideo().GetSectionIndex()+1)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := bc.GetBatch(cctx, &framepackv1.GetBatchRequest{BatchId: id})
	if err != nil {
		return err
	}
	b := resp.GetBatch()
	printBatch(e.stdout, b)
	if outDir != "" {
		if err := saveBatchVideos(ctx, e, framepackv1.NewJobServiceClient(conn), b, outDir, force); err != nil {
			return err
		}
	}
	switch {
	case b.GetFailed() > 0:
		return fail(exitFailed, "batch %s: %d of %d jobs failed", id, b.GetFailed(), len(b.GetJobs()))
	case b.GetCancelled() > 0:
		return fail(exitCancelled, "batch %s: %d of %d jobs cancelled", id, b.GetCancelled(), len(b.GetJobs()))
	}
	return nil
}

// isTerminalEvent reports whether ev ends its job.
func isTerminalEvent(ev *framepackv1.JobEvent) bool {
	return ev.GetJobFinished() != nil || ev.GetJobFailed() != nil || ev.GetJobCancelled() != nil
}

// saveBatchVideos downloads each succeeded job's video into dir as <image name>.mp4 (with the
// job id added when two images share a name).
func saveBatchVideos(ctx context.Context, e *env, client framepackv1.JobServiceClient, b *framepackv1.Batch, dir string, force bool) error {
	used := map[string]bool{}
	for _, j := range b.GetJobs() {
		if j.GetState() != framepackv1.JobState_JOB_STATE_SUCCEEDED {
			continue
		}
		stem := strings.TrimSuffix(j.GetSpec().GetImageFilename(), filepath.Ext(j.GetSpec().GetImageFilename()))
		if stem == "" || used[stem] {
			stem += "-" + j.GetId()
		}
		used[stem] = true
		out := filepath.Join(dir, stem+".mp4")
		if !force {
			if _, err := os.Stat(out); err == nil {
				return fail(exitError, "%s exists: give --force to overwrite it", out)
			}
		}
		if _, err := download(ctx, client, j.GetId(), out); err != nil {
			return err
		}
		fmt.Fprintln(e.stdout, out)
	}
	return nil
}

// defaultBatchID is the batch id made from a source's path: its base name (letters, digits and
// ._- only) and a hash of its absolute path, so the same source gives the same batch.
func defaultBatchID(src string) string {
	abs, err := filepath.Abs(src)
	if err != nil {
		abs = src
	}
	sum := sha256.Sum256([]byte(abs))
	base := regexp.MustCompile(`[^A-Za-z0-9._-]+`).ReplaceAllString(filepath.Base(abs), "_")
	if len(base) > 40 {
		base = base[:40]
	}
	return "b-" + base + "-" + hex.EncodeToString(sum[:4])
}

// itemRequestID is an item's client_request_id: the batch id and a hash of the item's image
// and spec, so running the same batch again returns its jobs, an edited item becomes a job of
// its own, and items may be reordered.
func itemRequestID(batch string, image []byte, spec *framepackv1.JobSpec) (string, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(spec)
	if err != nil {
		return "", fail(exitError, "batch: %v", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%d:", len(b))
	h.Write(b)
	h.Write(image)
	return batch + "/" + hex.EncodeToString(h.Sum(nil))[:24], nil
}

// itemSpec is the spec of one item: the command line's settings, then the item's own.
func itemSpec(base *specFlags, it batchItem) (*framepackv1.JobSpec, error) {
	fs := flag.NewFlagSet("framepack batch item", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var sf specFlags
	sf.register(fs)
	bound := sf.fs
	sf = *base
	sf.fs, sf.parent = bound, base
	sf.loras, sf.keyframes = slices.Clone(base.loras), slices.Clone(base.keyframes)
	for _, a := range it.args {
		switch {
		case strings.HasPrefix(a, "--lora="):
			sf.loras = nil // the item's LoRAs replace the command line's
		case strings.HasPrefix(a, "--keyframe="):
			sf.keyframes = nil // the same for keyframes
		}
	}
	if err := fs.Parse(it.args); err != nil {
		return nil, fail(exitUsage, "%s: %v", it.where, err)
	}
	if sf.prompt == "" && sf.preset == "" {
		return nil, fail(exitUsage, "%s: no prompt: give --prompt (every item) or a prompt column/key", it.where)
	}
	spec, err := sf.spec("batch")
	if err != nil {
		var ee *exitErr
		if errors.As(err, &ee) {
			return nil, fail(ee.code, "%s: %s", it.where, ee.msg)
		}
		return nil, err
	}
	return spec, nil
}

// exitCodeOf is the exit status an error carries (exitError when none).
func exitCodeOf(err error) int {
	var ee *exitErr
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitError
}

// batchItems reads a batch's source: a folder of images (each one job, by name), a CSV file (a
// header row naming the columns: image, and any settings flag without its dashes) or a JSONL
// file (one object a line, the same keys). Paths in a file are relative to its folder.
func batchItems(src string) ([]batchItem, error) {
	st, err := os.Stat(src)
	if err != nil {
		return nil, fail(exitError, "batch: %v", err)
	}
	var items []batchItem
	switch ext := strings.ToLower(filepath.Ext(src)); {
	case st.IsDir():
		ents, err := os.ReadDir(src)
		if err != nil {
			return nil, fail(exitError, "batch: %v", err)
		}
		for _, e := range ents {
			switch strings.ToLower(filepath.Ext(e.Name())) {
			case ".png", ".jpg", ".jpeg", ".webp":
				p := filepath.Join(src, e.Name())
				items = append(items, batchItem{where: p, image: p})
			}
		}
		sort.Slice(items, func(i, j int) bool { return items[i].image < items[j].image })
	case ext == ".csv":
		items, err = csvItems(src)
	case ext == ".jsonl":
		items, err = jsonlItems(src)
	default:
		return nil, fail(exitUsage, "batch: %s is neither a folder, a .csv nor a .jsonl file", src)
	}
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, fail(exitUsage, "batch: %s holds no items (images: .png, .jpg, .jpeg, .webp)", src)
	}
	return items, nil
}

// pathKeys are the keys whose values are files, relative to the batch file's folder.
var pathKeys = map[string]bool{"image": true, "end-image": true, "prompt-file": true, "input-video": true}

// item turns one row's keys and values into an item.
func item(where, dir string, keys, values []string) (batchItem, error) {
	it := batchItem{where: where}
	for i, k := range keys {
		k = strings.TrimLeft(strings.TrimSpace(k), "-")
		v := values[i]
		if v == "" {
			continue // an empty cell: the command line's setting
		}
		if pathKeys[k] && !filepath.IsAbs(v) {
			v = filepath.Join(dir, v)
		}
		if at, p, ok := strings.Cut(v, ":"); k == "keyframe" && ok && !filepath.IsAbs(p) {
			v = at + ":" + filepath.Join(dir, p)
		}
		if k == "image" {
			it.image = v
			continue
		}
		it.args = append(it.args, "--"+k+"="+v)
	}
	if it.image == "" && !slices.ContainsFunc(it.args, func(a string) bool {
		return strings.HasPrefix(a, "--input-video=") || strings.HasPrefix(a, "--extend-job=")
	}) {
		return it, fail(exitUsage, "%s: no image (or input-video, extend-job)", where)
	}
	return it, nil
}

func csvItems(path string) ([]batchItem, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fail(exitError, "batch: %v", err)
	}
	defer f.Close()
	r := csv.NewReader(f)
	rows, err := r.ReadAll()
	if err != nil {
		return nil, fail(exitUsage, "batch: %s: %v", path, err)
	}
	if len(rows) < 1 || !slices.Contains(rows[0], "image") {
		return nil, fail(exitUsage, "batch: %s: the first row must name the columns, one of them \"image\"", path)
	}
	var items []batchItem
	for i, row := range rows[1:] {
		it, err := item(fmt.Sprintf("%s line %d", path, i+2), filepath.Dir(path), rows[0], row)
		if err != nil {
			return nil, err
		}
		items = append(items, it)
	}
	return items, nil
}

func jsonlItems(path string) ([]batchItem, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fail(exitError, "batch: %v", err)
	}
	defer f.Close()
	var items []batchItem
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		where := fmt.Sprintf("%s line %d", path, n)
		dec := json.NewDecoder(strings.NewReader(line))
		dec.UseNumber()
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			return nil, fail(exitUsage, "%s: %v", where, err)
		}
		var keys, values []string
		for k, v := range obj {
			switch v := v.(type) {
			case string, json.Number, bool:
				keys, values = append(keys, k), append(values, fmt.Sprint(v))
			case []any: // several LoRAs
				for _, x := range v {
					keys, values = append(keys, k), append(values, fmt.Sprint(x))
				}
			default:
				return nil, fail(exitUsage, "%s: %q: want a string, number or boolean", where, k)
			}
		}
		it, err := item(where, filepath.Dir(path), keys, values)
		if err != nil {
			return nil, err
		}
		items = append(items, it)
	}
	if err := sc.Err(); err != nil {
		return nil, fail(exitError, "batch: %s: %v", path, err)
	}
	return items, nil
}
