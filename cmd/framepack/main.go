// Command framepack is the command-line client of framepackd.
//
// Usage:
//
//	framepack [--addr ADDR] [--timeout 30s] COMMAND …   (global flags before or after the command)
//	framepack --version
//	framepack generate --image IN (--prompt "…" | --prompt-file F) --out OUT.mp4 [--force] [--seconds 5]
//	                   [--seed 31337] [--steps 25] [--window 9] [--cfg 1] [--gs 10] [--rs 0]
//	                   [--teacache=true] [--resolution N] [--crf 16] [--gpu-preserve 6]
//	                   [--negative-prompt …] [--lane LANE] [--detach] [--quiet]
//	framepack jobs [--state queued,running,…] [--limit 20]
//	framepack watch ID [--previews DIR] [--out OUT.mp4 [--force]]
//	framepack cancel ID [--reason …]
//	framepack devices
//	framepack get ID [-o OUT.mp4] [--force]
//	framepack rm ID…
//	framepack pull [--variant i2v,f1] [--cache DIR]     (pull.go)
//	framepack models [verify] [--cache DIR]             (models.go)
//	framepack health [--service NAME] [--timeout 5s]
//	framepack presets save NAME [settings flags] | list | show NAME | rm NAME…   (presets.go)
//	framepack batch (DIR | FILE.csv | FILE.jsonl) [settings flags] [--batch-id ID] [--out-dir DIR] [--detach]
//	framepack batch status|watch|cancel BATCH_ID                                   (batch.go)
//
// Every command takes --addr (default: the daemon's default socket, see framepackd; or
// $FRAMEPACK_ADDR): a socket path, unix:///path, or tcp://host:port. A server not reached
// within a few seconds fails the command (exit 3, naming the address); one reached earlier in
// the command and then lost (a daemon restart) is waited for.
//
// generate's defaults are the server's (supervisor/pipeline/plan), which it gives every client that
// leaves a setting unset; --resolution is left to the server, whose models decide it (640 for
// FramePack's, 96 for the tiny test models).
//
// generate submits the job, shows its progress (a progress bar on a terminal, plain lines
// otherwise, on stderr) and, when the job has finished, copies the video to --out and prints
// its path on stdout. Ctrl-C cancels the job (a second Ctrl-C leaves at once). --out copies the
// video from the server's file system when it is readable here, and otherwise downloads it
// over the API (GetArtifact), as `framepack get ID -o OUT.mp4` does; an interrupted download
// resumes from OUT.mp4.partial.
//
// Exit status:
//
//	0  success
//	1  other errors (reading the image, writing the output, an unexpected server error)
//	2  bad command line
//	3  the server cannot be reached
//	4  the server refused the request (invalid argument; the bad fields are listed)
//	5  no such job
//	6  the job failed
//	7  the job was cancelled
//	8  the job finished but the server had no ffmpeg: the frames are PNG files (copied to
//	   OUT's name with ".frames" instead of ".mp4")
//	9  the server answers but does not serve: it cannot run jobs now (its model files are
//	   missing or broken; health and generate print why) or it is stopping
//	10 generate got SIGTERM and detached: the job stays on the server (framepack watch ID
//	   re-attaches)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/framepackd/framepackd/internal/apiaddr"
	"github.com/framepackd/framepackd/internal/buildinfo"
	"github.com/framepackd/framepackd/internal/envconfig"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// Exit statuses (see the package doc).
const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitUnreachable = 3
	exitRejected    = 4
	exitNotFound    = 5
	exitFailed      = 6
	exitCancelled   = 7
	exitPNGFrames   = 8
	exitUnhealthy   = 9
	exitDetached    = 10
)

// exitErr carries an exit status and the message printed for it.
type exitErr struct {
	code int
	msg  string
}

func (e *exitErr) Error() string { return e.msg }

func fail(code int, format string, args ...any) error {
	return &exitErr{code: code, msg: fmt.Sprintf(format, args...)}
}

// env is what a command works with.
type env struct {
	stdout, stderr io.Writer
	stdinTTY       bool
	stderrTTY      bool
	width          func() int
	signals        func() (<-chan os.Signal, func())
	server         *server // the server the command dialled (dial); nil before
}

func main() {
	e := &env{
		stdout:    os.Stdout,
		stderr:    os.Stderr,
		stderrTTY: isTerminal(os.Stderr),
		width:     func() int { return terminalWidth(os.Stderr) },
		signals: func() (<-chan os.Signal, func()) {
			ch := make(chan os.Signal, 2)
			signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
			return ch, func() { signal.Stop(ch) }
		},
	}
	os.Exit(run(context.Background(), e, os.Args[1:]))
}

const usage = `usage: framepack [--addr ADDR] [--timeout D] COMMAND [flags]
       framepack --version

commands:
  generate   submit a job, show its progress, save the video
  jobs       list jobs
  watch      follow a job's progress
  cancel     cancel a job
  devices    list the server's devices and lanes, with the model workers they keep
  unload     kill the model workers the server keeps alive between jobs
  get        download a job's video (works with a remote server)
  rm         delete finished jobs and their files on the server
  pull       download the models from the Hugging Face hub (no daemon needed)
  models     list the models in the Hugging Face cache; 'models verify' re-hashes them
  health     check the server's gRPC health (exit 0 when it serves)
  presets    save, list, show and remove named job settings on the server
  batch      submit a folder of images or a CSV/JSONL of jobs as one batch; batch status|watch|cancel ID

Run 'framepack COMMAND -h' for a command's flags.
`

// run runs one command and returns the exit status.
func run(ctx context.Context, e *env, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, usage)
		return exitUsage
	}
	cmds := map[string]func(context.Context, *env, []string) error{
		"generate": cmdGenerate,
		"jobs":     cmdJobs,
		"watch":    cmdWatch,
		"cancel":   cmdCancel,
		"devices":  cmdDevices,
		"unload":   cmdUnload,
		"get":      cmdGet,
		"rm":       cmdRm,
		"pull":     cmdPull,
		"models":   cmdModels,
		"health":   cmdHealth,
		"presets":  cmdPresets,
		"batch":    cmdBatch,
	}
	// Global flags may come before the command: framepack --addr X jobs.
	var global []string
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		a := args[0]
		if a == "-h" || a == "--help" || a == "-version" || a == "--version" {
			break
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name != "addr" && name != "timeout" {
			fmt.Fprintf(e.stderr, "framepack: %s before the command: only --addr and --timeout go there\n\n%s", a, usage)
			return exitUsage
		}
		global = append(global, a)
		args = args[1:]
		if !hasValue && len(args) > 0 {
			global = append(global, args[0])
			args = args[1:]
		}
	}
	if len(args) == 0 {
		fmt.Fprint(e.stderr, usage)
		return exitUsage
	}
	name := args[0]
	if name == "-h" || name == "--help" || name == "help" {
		fmt.Fprint(e.stdout, usage)
		return exitOK
	}
	if name == "--version" || name == "-version" || name == "version" {
		fmt.Fprintln(e.stdout, buildinfo.String("framepack"))
		return exitOK
	}
	cmd, ok := cmds[name]
	if !ok {
		fmt.Fprintf(e.stderr, "framepack: unknown command %q\n\n%s", name, usage)
		return exitUsage
	}
	err := cmd(ctx, e, append(global, args[1:]...))
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	var ee *exitErr
	if errors.As(err, &ee) {
		if ee.msg != "" {
			fmt.Fprintln(e.stderr, "framepack: "+ee.msg)
		}
		return ee.code
	}
	code, msg := describeAt(err, e.server)
	fmt.Fprintln(e.stderr, "framepack: "+msg)
	return code
}

// describe turns a gRPC error into an exit status and a readable message: the status code in
// words, the server's message, and each field violation on its own line.
func describe(err error) (int, string) { return describeAt(err, nil) }

// describeAt is describe for an error of a call to srv (nil: unknown): an unreachable server
// is named by its address, and a server that answered is not called unreachable.
func describeAt(err error, srv *server) (int, string) {
	st, ok := status.FromError(err)
	if !ok {
		return exitError, err.Error()
	}
	var b strings.Builder
	code := exitError
	switch st.Code() {
	case codes.Unavailable:
		switch {
		case notReady(err):
			// The server answered: it is up but cannot run jobs (its message says why).
			code = exitUnhealthy
			b.WriteString(st.Message())
		case srv == nil:
			code = exitUnreachable
			fmt.Fprintf(&b, "cannot reach the server: %s", st.Message())
		case !srv.reached():
			code = exitUnreachable
			fmt.Fprintf(&b, "cannot reach the server at %s: %s\n(is framepackd running there? --addr or $FRAMEPACK_ADDR give another address)", srv.addr, st.Message())
		default:
			code = exitUnreachable
			fmt.Fprintf(&b, "lost the server at %s: %s", srv.addr, st.Message())
		}
	case codes.DeadlineExceeded:
		code = exitUnreachable
		fmt.Fprintf(&b, "the server did not answer in time: %s", st.Message())
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange, codes.ResourceExhausted:
		code = exitRejected
		var fields []*errdetails.BadRequest_FieldViolation
		for _, d := range st.Details() {
			if br, ok := d.(*errdetails.BadRequest); ok {
				fields = append(fields, br.GetFieldViolations()...)
			}
		}
		if len(fields) == 0 {
			fmt.Fprintf(&b, "the server refused the request: %s", st.Message())
			break
		}
		b.WriteString("the server refused the request:")
		for _, f := range fields {
			fmt.Fprintf(&b, "\n  %s: %s", flagOf(f.GetField()), f.GetDescription())
		}
	case codes.NotFound:
		code = exitNotFound
		b.WriteString(st.Message())
	default:
		fmt.Fprintf(&b, "%s: %s", strings.ToLower(strings.ReplaceAll(st.Code().String(), "_", " ")), st.Message())
	}
	return code, b.String()
}

// flagOf names a request field by the flag that sets it, when there is one: "spec.steps"
// reads "--steps (spec.steps)".
func flagOf(field string) string {
	flags := map[string]string{
		"image":                               "--image",
		"spec.prompt":                         "--prompt",
		"spec.negative_prompt":                "--negative-prompt",
		"spec.total_second_length":            "--seconds",
		"spec.latent_window_size":             "--window",
		"spec.steps":                          "--steps",
		"spec.cfg":                            "--cfg",
		"spec.gs":                             "--gs",
		"spec.rs":                             "--rs",
		"spec.resolution":                     "--resolution",
		"spec.mp4_crf":                        "--crf",
		"spec.gpu_memory_preservation_gb":     "--gpu-preserve",
		"spec.lane":                           "--lane",
		"spec.image_filename":                 "--image",
		"spec.variant":                        "--variant",
		"spec.loras":                          "--lora",
		"spec.end_image":                      "--end-image",
		"spec.end_strength":                   "--end-strength",
		"reason":                              "--reason",
		"spec.cache":                          "--cache",
		"spec.use_teacache":                   "--teacache",
		"spec.magcache_threshold":             "--magcache-threshold",
		"spec.magcache_max_consecutive_skips": "--magcache-max-skips",
		"spec.magcache_retention_ratio":       "--magcache-retention",
		"spec.preset":                         "--preset",
		"spec.input_video":                    "--input-video",
		"spec.input_video_job_id":             "--extend-job",
		"spec.video_context_frames":           "--video-context-frames",
		"spec.video_include_input":            "--video-include-input",
		"spec.weights":                        "--weights",
		"spec.transformer_checkpoint":         "--transformer-checkpoint",
		"spec.fp8_compute":                    "--fp8-compute",
		"spec.keep_alive":                     "--keep-alive",
	}
	if f, ok := flags[field]; ok {
		return f + " (" + field + ")"
	}
	if strings.HasPrefix(field, "spec.loras[") { // spec.loras[1].path: the second --lora
		return "--lora (" + field + ")"
	}
	if strings.HasPrefix(field, "spec.keyframes") {
		return "--keyframe (" + field + ")"
	}
	return field
}

// common are the flags of every command.
type common struct {
	addr    string
	timeout time.Duration
}

func defaultAddr() string {
	if a := envconfig.Addr.Get(); a != "" {
		return a
	}
	return apiaddr.DefaultSocketPath()
}

func newFlags(name string, e *env, c *common) *flag.FlagSet {
	fs := flag.NewFlagSet("framepack "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.StringVar(&c.addr, "addr", defaultAddr(), "server address: socket path, unix:///path or tcp://host:port ($"+envconfig.Addr.Name+")")
	fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "deadline of each request (not of watching)")
	return fs
}

// parse parses args, allowing flags after positional arguments ("watch ID --addr X").
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &exitErr{code: exitUsage}
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// unreachableAfter is how long a command keeps trying a server it has not reached yet (a
// daemon still starting) before it gives up; a server it reached before, which then went
// away, is given reconnectFor (a restart).
const unreachableAfter = 3 * time.Second

// connectTimeout bounds one attempt to connect (TCP and TLS handshakes).
const connectTimeout = 5 * time.Second

// server is the connection to the daemon and what this command has seen of it.
type server struct {
	*grpc.ClientConn
	addr string // the address as given (--addr, $FRAMEPACK_ADDR or the default socket)
	seen atomic.Bool
	up   atomic.Bool
	// lost is set when a call or the event stream lost the server, and cleared by the next
	// answer: the channel's state (up) may still read Ready for a moment after the stream
	// broke.
	lost atomic.Bool
}

// reached reports whether the connection was up at some time during this command: the
// daemon was there, so losing it is a restart worth waiting for.
func (s *server) reached() bool { return s.seen.Load() }

// connected reports whether the connection is up now: the channel is ready and no call has
// lost the server since its last answer.
func (s *server) connected() bool { return s.up.Load() && !s.lost.Load() }

// answered records an answer from the server; markLost a call that lost it.
func (s *server) answered() { s.lost.Store(false) }
func (s *server) markLost() { s.lost.Store(true) }

// watchState follows the connection's state until it is closed.
func (s *server) watchState() {
	for {
		st := s.GetState()
		s.up.Store(st == connectivity.Ready)
		if st == connectivity.Ready {
			s.seen.Store(true)
		}
		if st == connectivity.Shutdown || !s.WaitForStateChange(context.Background(), st) {
			return
		}
	}
}

// addrFlag is the --addr part of a command printed for the user: empty for the default
// socket, which a command run later finds without it.
func (s *server) addrFlag() string {
	if s == nil || s.addr == apiaddr.DefaultSocketPath() {
		return ""
	}
	return " --addr " + shellQuote(s.addr)
}

// shellQuote quotes a word for a POSIX shell when it needs it.
func shellQuote(w string) string {
	if w != "" && !strings.ContainsFunc(w, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-:+,=@%", r))
	}) {
		return w
	}
	return "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
}

// dial connects to the server (lazily: errors appear on the first call) and records it in e.
func dial(e *env, c *common) (*server, error) {
	a, err := apiaddr.ParseAddr(c.addr)
	if err != nil {
		return nil, fail(exitUsage, "--addr: %v", err)
	}
	opts, err := transportOptions(a) // TLS and token on TCP (tcpauth.go)
	if err != nil {
		return nil, fail(exitUsage, "%v", err)
	}
	// A TCP address that never answers (a firewall dropping packets) fails a connection
	// attempt after connectTimeout instead of gRPC's 20 s, so that unreachableAfter holds
	// there too.
	opts = append(opts, grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: connectTimeout}))
	conn, err := grpc.NewClient(a.Target(), opts...)
	if err != nil {
		return nil, fail(exitUnreachable, "connect to %s: %v", a, err)
	}
	s := &server{ClientConn: conn, addr: c.addr}
	go s.watchState()
	e.server = s
	return s, nil
}
