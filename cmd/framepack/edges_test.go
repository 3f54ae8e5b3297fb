package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// TestCLIEdges covers issue 15's CLI items: --version, global flags before the command,
// --prompt-file, and SIGTERM detaching from a running job with the command to re-attach.
func TestCLIEdges(t *testing.T) {
	f := setup(t)
	if r := f.cli(t, "--version"); r.code != exitOK || !strings.HasPrefix(r.stdout, "framepack ") || !strings.Contains(r.stdout, "go1.") {
		t.Fatalf("--version: exit %d %q %s", r.code, r.stdout, r.stderr)
	}
	// Global flags before the command (the environment's address is wrong on purpose).
	cmd := f.command(t, "--addr", f.addr, "--timeout=10s", "devices")
	cmd.Env = append(cmd.Env, "FRAMEPACK_ADDR=/nonexistent/x.sock")
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "cpu") {
		t.Fatalf("global flags before the command: %v\n%s", err, out)
	}
	if r := f.cli(t, "--image", "x", "jobs"); r.code != exitUsage || !strings.Contains(r.stderr, "only --addr and --timeout") {
		t.Fatalf("command flag before the command: exit %d %s", r.code, r.stderr)
	}

	// --prompt-file.
	pf := filepath.Join(f.dir, "prompt.txt")
	if err := os.WriteFile(pf, []byte("a cat from a file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := f.cli(t, "generate", "--image", f.image, "--prompt-file", pf, "--seconds", "1", "--steps", "1", "--detach")
	id := strings.TrimSpace(r.stdout)
	if r.code != exitOK {
		t.Fatalf("--prompt-file: exit %d %s", r.code, r.stderr)
	}
	job, err := f.d.Store().Get(id)
	if err != nil || job.GetSpec().GetPrompt() != "a cat from a file" {
		t.Fatalf("prompt from file: %v %v", job.GetSpec().GetPrompt(), err)
	}

	// SIGTERM: the CLI leaves, the job keeps running, and the message says how to come back.
	gen := f.command(t, "generate", "--image", f.image, "--prompt", "block here", "--out", filepath.Join(f.dir, "bg.mp4"))
	stderr := &watchedBuffer{want: "queued", seen: make(chan struct{})}
	gen.Stderr = stderr
	if err := gen.Start(); err != nil {
		t.Fatal(err)
	}
	running := f.waitBlocked(t)
	stderr.wait(t) // the CLI has its job id (the run can start before the SubmitJob answer arrives)
	if err := gen.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = gen.Wait()
	if code := gen.ProcessState.ExitCode(); code != exitDetached || !strings.Contains(stderr.String(), "framepack watch "+running) {
		t.Fatalf("after SIGTERM: exit %d, stderr:\n%s", code, stderr.String())
	}
	if j, err := f.d.Store().Get(running); err != nil || j.GetState() != framepackv1.JobState_JOB_STATE_RUNNING {
		t.Fatalf("job after the CLI detached: %v %v", j.GetState(), err)
	}
	if r := f.cli(t, "cancel", running); r.code != exitOK {
		t.Fatalf("cancel: %d %s", r.code, r.stderr)
	}
}
