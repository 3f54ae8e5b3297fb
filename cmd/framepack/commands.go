package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
	"github.com/framepackd/framepackd/supervisor/video"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// reconnectFor is how long watching keeps trying to reach a server that went away (a daemon
// restart), after which it gives up.
const reconnectFor = 60 * time.Second

func cmdGenerate(ctx context.Context, e *env, args []string) error {
	var c common
	fs := newFlags("generate", e, &c)
	var (
		sf                   specFlags
		image, out           string
		detach, quiet, force bool
	)
	sf.register(fs)
	fs.StringVar(&image, "image", "", "start frame: PNG, JPEG or WebP (required)")
	fs.StringVar(&out, "out", "", "where to save the MP4 (required unless --detach); an existing file only with --force")
	fs.BoolVar(&force, "force", false, "overwrite --out if it exists")
	fs.BoolVar(&detach, "detach", false, "submit, print the job id and return")
	fs.BoolVar(&quiet, "quiet", false, "no progress output")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fail(exitUsage, "generate: unexpected arguments %q", pos)
	}
	if err := sf.readPrompt("generate"); err != nil {
		return err
	}
	switch {
	case image == "" && !sf.extends() || (sf.prompt == "" && sf.preset == "") || (out == "" && !detach):
		return fail(exitUsage, "generate: --image (or --input-video, --extend-job), --prompt (or a --preset with one) and --out are required (--out not with --detach)")
	case image != "" && sf.extends():
		return fail(exitUsage, "generate: a video extension takes no --image: its frames come from the video")
	}
	if out != "" && video.FramesDir(out) == out {
		return fail(exitUsage, "generate: --out %q: give the file an extension (.mp4)", out)
	}
	if out != "" {
		if err := checkOut(out, force); err != nil {
			return err
		}
	}
	spec, err := sf.spec("generate")
	if err != nil {
		return err
	}
	var img []byte
	if image != "" {
		if img, err = readImageFile(image, "image"); err != nil {
			return err
		}
		spec.ImageFilename = filepath.Base(image)
	}
	conn, err := dial(e, &c)
	if err != nil {
		return err
	}
	defer conn.Close()
	client := framepackv1.NewJobServiceClient(conn)
	requestID, err := newClientRequestID()
	if err != nil {
		return fail(exitError, "%v", err)
	}
	d := newDisplay(e, quiet)
	job, err := submit(ctx, client, conn, &framepackv1.SubmitJobRequest{Image: img, Spec: spec, ClientRequestId: requestID}, c.timeout, d)
	if err != nil {
		return err
	}
	id := job.GetId()
	if detach {
		fmt.Fprintln(e.stdout, id)
		return nil
	}
	if !quiet {
		fmt.Fprintf(e.stderr, "job %s queued (%d sections at resolution %d)\n", id, sectionsOf(job), job.GetSpec().GetResolution())
	}
	d.getHint = "framepack get " + id + conn.addrFlag()
	reattach := "framepack watch " + id + conn.addrFlag() + outHint(out, force)

	// Ctrl-C cancels the job; the stream then ends with job_cancelled. A second one leaves.
	// SIGTERM (a closed session, a service manager) leaves the job running and says how to
	// come back to it.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	sigs, stopSigs := e.signals()
	defer stopSigs()
	detached := make(chan struct{})
	go func() {
		n := 0
		for {
			select {
			case sig := <-sigs:
				if sig == syscall.SIGTERM {
					close(detached)
					stopWatch()
					return
				}
				n++
				if n > 1 {
					stopWatch()
					return
				}
				fmt.Fprintf(e.stderr, "\ncancelling job %s (Ctrl-C again to leave without waiting)\n", id)
				cctx, cancel := context.WithTimeout(ctx, c.timeout)
				if _, err := client.CancelJob(cctx, &framepackv1.CancelJobRequest{JobId: id, Reason: "interrupted from the command line"}); err != nil {
					_, msg := describeAt(err, conn)
					fmt.Fprintln(e.stderr, "framepack: cancel: "+msg)
				}
				cancel()
			case <-wctx.Done():
				return
			}
		}
	}()

	last, err := follow(wctx, client, conn, id, d, "")
	if err != nil {
		select {
		case <-detached:
			if !conn.connected() {
				// The job is stored on the server, which is not there now: it goes on
				// only when the daemon runs again.
				return fail(exitDetached, "detached from job %s while the server at %s cannot be reached; the job resumes from its last finished section when the daemon runs again. Re-attach with: %s", id, conn.addr, reattach)
			}
			return fail(exitDetached, "detached from job %s; it keeps running on the server. Re-attach with: %s", id, reattach)
		default:
		}
		if wctx.Err() != nil && ctx.Err() == nil {
			return fail(exitCancelled, "left job %s without waiting for it; re-attach with: %s", id, reattach)
		}
		if status.Code(err) == codes.Unavailable {
			_, msg := describeAt(err, conn)
			return fail(exitUnreachable, "%s\nthe job is stored on the server and runs when it is back: re-attach with: %s", msg, reattach)
		}
		return err
	}
	return finish(ctx, e, client, last, out)
}

// outHint is the --out (and --force) part of a re-attach command.
func outHint(out string, force bool) string {
	if out == "" {
		return ""
	}
	h := " --out " + shellQuote(out)
	if force {
		h += " --force"
	}
	return h
}

// finish reports a job's terminal event and saves its video to out (when out is set): a copy
// when the server's file is readable here, else a download over the API.
func finish(ctx context.Context, e *env, client framepackv1.JobServiceClient, last *framepackv1.JobEvent, out string) error {
	switch {
	case last.GetJobFinished() != nil:
		res := last.GetJobFinished().GetResult()
		src := res.GetVideoPath()
		st, err := os.Stat(src)
		if out == "" {
			fmt.Fprintln(e.stdout, src)
			if err == nil && st.IsDir() {
				return fail(exitPNGFrames, "the server has no ffmpeg: the video is PNG frames in %s", src)
			}
			return nil
		}
		if err != nil {
			// Not on this machine's disk (a remote server, or another user's files).
			if _, derr := download(ctx, client, last.GetJobId(), out); derr != nil {
				return derr
			}
			fmt.Fprintln(e.stdout, out)
			return nil
		}
		if st.IsDir() {
			dst := video.FramesDir(out)
			if err := copyDir(src, dst); err != nil {
				return fail(exitError, "save frames: %v", err)
			}
			fmt.Fprintln(e.stdout, dst)
			return fail(exitPNGFrames, "the server has no ffmpeg: saved the %d frames as PNG files in %s, not %s", res.GetFrameCount(), dst, out)
		}
		if err := copyFile(src, out); err != nil {
			return fail(exitError, "save video: %v", err)
		}
		fmt.Fprintln(e.stdout, out)
		return nil
	case last.GetJobFailed() != nil:
		return fail(exitFailed, "job %s failed: %s", last.GetJobId(), failureText(last.GetJobFailed().GetFailure()))
	case last.GetJobCancelled() != nil:
		msg := "job " + last.GetJobId() + " was cancelled"
		if r := last.GetJobCancelled().GetReason(); r != "" {
			msg += ": " + r
		}
		return fail(exitCancelled, "%s", msg)
	}
	return fail(exitError, "stream ended without a final event")
}

func failureText(f *framepackv1.JobFailure) string {
	var b strings.Builder
	b.WriteString(f.GetMessage())
	if f.GetStage() != framepackv1.Stage_STAGE_UNSPECIFIED {
		fmt.Fprintf(&b, " (stage %s, section %d)", stageName(f.GetStage()), f.GetSectionIndex()+1)
	}
	for _, a := range f.GetAttempts() {
		fmt.Fprintf(&b, "\n  attempt %d of %s: %s", a.GetAttempt(), stageName(a.GetStage()), className(a.GetClass()))
		if a.GetMessage() != "" {
			b.WriteString(": " + a.GetMessage())
		}
		if a.GetChange() != "" {
			b.WriteString("; then " + a.GetChange())
		}
	}
	return b.String()
}

func className(c framepackv1.AttemptClass) string {
	return strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(c.String(), "ATTEMPT_CLASS_"), "_", " "))
}

// connectionLost is the note shown when a call or the event stream lost the server and the
// CLI tries again.
const connectionLost = "connection to the server lost; reconnecting"

// newClientRequestID returns a random SubmitJobRequest.client_request_id: 16 bytes, in hex.
func newClientRequestID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("client request id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// submit sends req, whose client_request_id makes a repeat return the first one's job. When
// the connection is lost (UNAVAILABLE: a daemon that died or restarts, maybe after it stored
// the job) it sends req again the way follow reconnects, until the server answers or timeout
// has passed since the first try. A server that is up but cannot run jobs now is not retried,
// nor, beyond unreachableAfter, one that was never reached.
func submit(ctx context.Context, client framepackv1.JobServiceClient, srv *server, req *framepackv1.SubmitJobRequest, timeout time.Duration, d *display) (*framepackv1.Job, error) {
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lost := func(err error) bool { return status.Code(err) == codes.Unavailable && !notReady(err) }
	var job *framepackv1.Job
	err := retryLost(sctx, d, srv, timeout, func() error {
		resp, err := client.SubmitJob(sctx, req)
		job = resp.GetJob()
		return err
	}, lost)
	if err != nil {
		// retryLost gives up on a lost connection only once sctx has ended.
		if lost(err) && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return job, nil
}

// retryLost calls try until it succeeds or fails with an error that lost does not take for a
// lost connection, and returns that error. After a lost connection it waits a second and tries
// again; it returns the lost connection's error once budget has passed since the first one, or
// when ctx ends during a wait. A server this command never reached (srv) is given only
// unreachableAfter (a daemon still starting), and the connectionLost note is shown only for a
// server that was there.
func retryLost(ctx context.Context, d *display, srv *server, budget time.Duration, try func() error, lost func(error) bool) error {
	var lostSince time.Time
	noted := false
	for {
		err := try()
		if err == nil || !lost(err) {
			if status.Code(err) != codes.Unavailable {
				srv.answered() // nil, or an error the server itself returned
			}
			return err
		}
		srv.markLost()
		if lostSince.IsZero() {
			lostSince = time.Now()
		}
		limit := budget
		if !srv.reached() {
			limit = min(budget, unreachableAfter)
		} else if !noted {
			noted = true
			d.note(connectionLost)
		}
		if time.Since(lostSince) > limit {
			return err
		}
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return err
		}
	}
}

// Reasons of the server's ErrorInfo details (supervisor/api) the CLI acts on.
const (
	// reasonNotReady: the server is up but cannot run jobs now (api.ReasonNotReady).
	reasonNotReady = "NOT_READY"
	// reasonJobNotFinished: DeleteJob of a queued or running job (api.ReasonJobNotFinished).
	reasonJobNotFinished = "JOB_NOT_FINISHED"
)

// notReady reports whether err is the server's refusal to take jobs while it cannot run them
// (supervisor/api.ReasonNotReady), as opposed to a lost connection.
func notReady(err error) bool { return hasReason(err, reasonNotReady) }

// hasReason reports whether err is a status from the server with an ErrorInfo of reason.
func hasReason(err error, reason string) bool {
	st, _ := status.FromError(err)
	for _, detail := range st.Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok && info.GetReason() == reason {
			return true
		}
	}
	return false
}

// follow streams job id's events into d until the terminal event, which it returns. When the
// stream breaks because the server went away it reconnects (the server replays the history)
// for up to reconnectFor; a server never reached is given up after unreachableAfter. previews,
// when set, is a directory for preview PNGs.
func follow(ctx context.Context, client framepackv1.JobServiceClient, srv *server, id string, d *display, previews string) (*framepackv1.JobEvent, error) {
	defer d.done()
	var last *framepackv1.JobEvent
	err := retryLost(ctx, d, srv, reconnectFor, func() error {
		ev, err := followOnce(ctx, client, srv, id, d, previews)
		if err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
		last = ev
		return err
	}, func(err error) bool { return status.Code(err) == codes.Unavailable })
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return last, nil
}

func followOnce(ctx context.Context, client framepackv1.JobServiceClient, srv *server, id string, d *display, previews string) (*framepackv1.JobEvent, error) {
	stream, err := client.WatchJob(ctx, &framepackv1.WatchJobRequest{JobId: id, IncludePreviews: previews != ""})
	if err != nil {
		return nil, err
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, status.Error(codes.Unavailable, "stream ended before the job did")
			}
			return nil, err
		}
		srv.answered()
		if p := ev.GetPreview(); p != nil && previews != "" {
			name := filepath.Join(previews, fmt.Sprintf("section-%03d-step-%03d.png", p.GetSectionIndex(), p.GetStep()))
			if err := os.WriteFile(name, p.GetPng(), 0o644); err != nil {
				d.note(fmt.Sprintf("write preview: %v", err))
			}
		}
		d.event(ev)
		if ev.GetJobFinished() != nil || ev.GetJobFailed() != nil || ev.GetJobCancelled() != nil {
			return ev, nil
		}
	}
}

func cmdWatch(ctx context.Context, e *env, args []string) error {
	var c common
	fs := newFlags("watch", e, &c)
	var previews, out string
	var quiet, force bool
	fs.StringVar(&previews, "previews", "", "directory to save preview PNGs into")
	fs.StringVar(&out, "out", "", "when the job finishes, save its video here; an existing file only with --force")
	fs.BoolVar(&force, "force", false, "overwrite --out if it exists")
	fs.BoolVar(&quiet, "quiet", false, "no progress output")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fail(exitUsage, "watch: want one job id")
	}
	if out != "" {
		if err := checkOut(out, force); err != nil {
			return err
		}
	}
	if previews != "" {
		if err := os.MkdirAll(previews, 0o755); err != nil {
			return fail(exitError, "previews: %v", err)
		}
	}
	conn, err := dial(e, &c)
	if err != nil {
		return err
	}
	defer conn.Close()
	client := framepackv1.NewJobServiceClient(conn)
	d := newDisplay(e, quiet)
	d.getHint = "framepack get " + pos[0] + conn.addrFlag()
	last, err := follow(ctx, client, conn, pos[0], d, previews)
	if err != nil {
		return err
	}
	return finish(ctx, e, client, last, out)
}

func cmdCancel(ctx context.Context, e *env, args []string) error {
	var c common
	fs := newFlags("cancel", e, &c)
	var reason string
	fs.StringVar(&reason, "reason", "", "why (recorded with the job)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fail(exitUsage, "cancel: want one job id")
	}
	conn, err := dial(e, &c)
	if err != nil {
		return err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	client := framepackv1.NewJobServiceClient(conn)
	before, err := client.GetJob(cctx, &framepackv1.GetJobRequest{JobId: pos[0]})
	if err != nil {
		return err
	}
	if st := before.GetJob().GetState(); isFinal(st) {
		fmt.Fprintf(e.stdout, "job %s had already ended: %s\n", pos[0], stateName(st))
		return nil
	}
	resp, err := client.CancelJob(cctx, &framepackv1.CancelJobRequest{JobId: pos[0], Reason: reason})
	if err != nil {
		return err
	}
	if st := resp.GetJob().GetState(); st == framepackv1.JobState_JOB_STATE_CANCELLED {
		fmt.Fprintf(e.stdout, "job %s cancelled\n", pos[0])
	} else {
		fmt.Fprintf(e.stdout, "job %s had already ended: %s\n", pos[0], stateName(st))
	}
	return nil
}

func isFinal(s framepackv1.JobState) bool {
	switch s {
	case framepackv1.JobState_JOB_STATE_SUCCEEDED, framepackv1.JobState_JOB_STATE_FAILED, framepackv1.JobState_JOB_STATE_CANCELLED:
		return true
	}
	return false
}

func parseStates(s string) ([]framepackv1.JobState, error) {
	var out []framepackv1.JobState
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		v, ok := framepackv1.JobState_value["JOB_STATE_"+strings.ToUpper(name)]
		if !ok || v == 0 {
			return nil, fail(exitUsage, "jobs: --state %q: want queued, running, succeeded, failed or cancelled", name)
		}
		out = append(out, framepackv1.JobState(v))
	}
	return out, nil
}

func cmdJobs(ctx context.Context, e *env, args []string) error {
	var c common
	fs := newFlags("jobs", e, &c)
	var states string
	var limit int
	fs.StringVar(&states, "state", "", "only jobs in these states, comma-separated (queued,running,succeeded,failed,cancelled)")
	fs.IntVar(&limit, "limit", 20, "most jobs to list, newest first (0: all)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fail(exitUsage, "jobs: unexpected arguments %q", pos)
	}
	if limit < 0 {
		return fail(exitUsage, "jobs: --limit must not be negative")
	}
	want, err := parseStates(states)
	if err != nil {
		return err
	}
	conn, err := dial(e, &c)
	if err != nil {
		return err
	}
	defer conn.Close()
	client := framepackv1.NewJobServiceClient(conn)
	var list []*framepackv1.Job
	token := ""
	for {
		page := uint32(1000)
		if limit > 0 {
			page = uint32(min(limit-len(list), 1000))
		}
		lctx, cancel := context.WithTimeout(ctx, c.timeout)
		resp, err := client.ListJobs(lctx, &framepackv1.ListJobsRequest{PageSize: page, PageToken: token, States: want})
		cancel()
		if err != nil {
			return err
		}
		list = append(list, resp.GetJobs()...)
		token = resp.GetNextPageToken()
		if token == "" || (limit > 0 && len(list) >= limit) {
			break
		}
	}
	if len(list) == 0 {
		fmt.Fprintln(e.stderr, "no jobs")
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tPROGRESS\tCREATED\tLENGTH\tLANE\tPROMPT")
	for _, j := range list {
		created := "-"
		if j.GetCreateTime() != nil {
			created = j.GetCreateTime().AsTime().Local().Format("2006-01-02 15:04:05")
		}
		prog := fmt.Sprintf("%3.0f%%", 100*j.GetProgress().GetFraction())
		if p := j.GetProgress(); j.GetState() == framepackv1.JobState_JOB_STATE_RUNNING && p.GetTotalSections() > 0 {
			prog += fmt.Sprintf(" s%d/%d", p.GetSectionIndex()+1, p.GetTotalSections())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%gs\t%s\t%s\n", j.GetId(), stateName(j.GetState()), prog, created,
			j.GetSpec().GetTotalSecondLength(), orDash(j.GetLane()), truncate(j.GetSpec().GetPrompt(), 48))
	}
	return tw.Flush()
}

func cmdDevices(ctx context.Context, e *env, args []string) error {
	var c common
	fs := newFlags("devices", e, &c)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fail(exitUsage, "devices: unexpected arguments %q", pos)
	}
	conn, err := dial(e, &c)
	if err != nil {
		return err
	}
	defer conn.Close()
	dctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := framepackv1.NewDeviceServiceClient(conn).ListDevices(dctx, &framepackv1.ListDevicesRequest{})
	if err != nil {
		return err
	}
	if r := resp.GetNotServingReason(); r != "" {
		fmt.Fprintln(e.stderr, "framepack: the server does not run jobs now: "+r)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LANE\tBACKEND\tNAME\tARCH\tMEMORY USED/TOTAL\tSTATE\tJOB\tKEPT WORKERS")
	for _, d := range resp.GetDevices() {
		st := strings.ToLower(strings.TrimPrefix(d.GetLaneState().String(), "LANE_STATE_"))
		if d.GetLaneStateReason() != "" {
			st += " (" + d.GetLaneStateReason() + ")"
		}
		mem := gib(d.GetUsedMemoryBytes()) + "/" + gib(d.GetTotalMemoryBytes())
		if l := d.GetMemoryLimitBytes(); l > 0 {
			mem += " (lane limit " + gib(l) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.GetLane(), d.GetBackend(), orDash(d.GetName()), orDash(d.GetArch()),
			mem, st, orDash(d.GetCurrentJobId()), orDash(keptWorkers(d.GetKeptWorkers(), time.Now())))
	}
	return tw.Flush()
}

func gib(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func truncate(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func stateName(s framepackv1.JobState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "JOB_STATE_"))
}

func sectionsOf(j *framepackv1.Job) int {
	// The server fills total_sections when the job starts; before, compute as it will.
	if n := j.GetProgress().GetTotalSections(); n > 0 {
		return int(n)
	}
	return plan.TotalSections(j.GetSpec())
}

// copyFile copies src to dst through "dst.partial", renamed when complete.
func copyFile(src, dst string) error {
	if same(src, dst) {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".partial"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(tmp)
		return err
	}
	if err := out.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, dst)
}

func same(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// copyDir copies the regular files of src into dst (created; files replaced).
func copyDir(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	names := make([]string, 0, len(entries))
	for _, en := range entries {
		if en.Type().IsRegular() {
			names = append(names, en.Name())
		}
	}
	slices.Sort(names)
	for _, n := range names {
		if err := copyFile(filepath.Join(src, n), filepath.Join(dst, n)); err != nil {
			return err
		}
	}
	return nil
}

// absPath is p made absolute (the server reads it), empty for empty.
func absPath(p string) string {
	if p == "" {
		return ""
	}
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// loraFlags collects repeated --lora PATH[:STRENGTH] flags; paths are made absolute, as the
// server wants them.
type loraFlags []*framepackv1.Lora

// String lists the LoRAs as given.
func (l *loraFlags) String() string {
	parts := make([]string, len(*l))
	for i, x := range *l {
		parts[i] = fmt.Sprintf("%s:%g", x.GetPath(), x.GetStrength())
	}
	return strings.Join(parts, ",")
}

// Set adds one LoRA: PATH, or PATH:STRENGTH when what follows the last colon is a number.
func (l *loraFlags) Set(v string) error {
	path, strength := v, float32(1)
	if i := strings.LastIndexByte(v, ':'); i > 0 {
		if f, err := strconv.ParseFloat(v[i+1:], 32); err == nil {
			path, strength = v[:i], float32(f)
		}
	}
	if path == "" {
		return errors.New("a LoRA file path is required")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("lora %s: %w", path, err)
	}
	*l = append(*l, &framepackv1.Lora{Path: abs, Strength: strength})
	return nil
}
