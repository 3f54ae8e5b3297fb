package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// download streams job id's video from the server into out, through "out.partial": an
// existing partial file is resumed from its size. It returns the bytes the file has.
func download(ctx context.Context, client framepackv1.JobServiceClient, id, out string) (int64, error) {
	tmp := out + ".partial"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return 0, fail(exitError, "save video: %v", err)
	}
	defer func() {
		f.Close()
		// Nothing came: leave no empty partial file behind (an unknown job, a refusal).
		if st, err := os.Stat(tmp); err == nil && st.Size() == 0 {
			os.Remove(tmp)
		}
	}()
	off, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, fail(exitError, "save video: %v", err)
	}
	stream, err := client.GetArtifact(ctx, &framepackv1.GetArtifactRequest{JobId: id, Offset: off})
	if err != nil {
		return 0, err
	}
	total := int64(-1)
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return off, err // the partial file stays: running the command again resumes
		}
		if total < 0 {
			total = chunk.GetTotalSize()
		}
		if chunk.GetOffset() != off {
			return off, fail(exitError, "download: the server sent bytes from %d, want %d", chunk.GetOffset(), off)
		}
		if _, err := f.Write(chunk.GetData()); err != nil {
			return off, fail(exitError, "save video: %v", err)
		}
		off += int64(len(chunk.GetData()))
	}
	if total >= 0 && off != total {
		return off, fail(exitError, "download: got %d of %d bytes; run the command again to resume", off, total)
	}
	if err := f.Close(); err != nil {
		return off, fail(exitError, "save video: %v", err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return off, fail(exitError, "save video: %v", err)
	}
	return off, nil
}

func cmdGet(ctx context.Context, e *env, args []string) error {
	var c common
	fs := newFlags("get", e, &c)
	var out string
	var force bool
	fs.StringVar(&out, "o", "", "file to save the video to (default: ID.mp4 here); an existing file only with --force")
	fs.StringVar(&out, "out", "", "same as -o")
	fs.BoolVar(&force, "force", false, "overwrite the file if it exists")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fail(exitUsage, "get: want one job id")
	}
	id := pos[0]
	if out == "" {
		out = id + ".mp4"
	}
	if err := checkOut(out, force); err != nil {
		return err
	}
	conn, err := dial(e, &c)
	if err != nil {
		return err
	}
	defer conn.Close()
	n, err := download(ctx, framepackv1.NewJobServiceClient(conn), id, out)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "saved %d bytes\n", n)
	fmt.Fprintln(e.stdout, out)
	return nil
}

func cmdRm(ctx context.Context, e *env, args []string) error {
	var c common
	fs := newFlags("rm", e, &c)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return fail(exitUsage, "rm: want one or more job ids")
	}
	conn, err := dial(e, &c)
	if err != nil {
		return err
	}
	defer conn.Close()
	client := framepackv1.NewJobServiceClient(conn)
	for _, id := range pos {
		rctx, cancel := context.WithTimeout(ctx, c.timeout)
		resp, err := client.DeleteJob(rctx, &framepackv1.DeleteJobRequest{JobId: id})
		cancel()
		if hasReason(err, reasonJobNotFinished) {
			return fail(exitRejected, "job %s has not finished; cancel it first (framepack cancel %s%s)", id, id, conn.addrFlag())
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "job %s deleted (%.1f MiB freed)\n", id, float64(resp.GetFreedBytes())/(1<<20))
	}
	return nil
}

// checkOut fails when out cannot be written: its folder is missing or not writable, out is a
// folder, or out exists and force is not set. It runs before a job is submitted, so a typo
// does not cost a whole job.
func checkOut(out string, force bool) error {
	if st, err := os.Stat(out); err == nil {
		if st.IsDir() {
			return fail(exitUsage, "--out %s is a folder; give a file name (video.mp4)", out)
		}
		if !force {
			return fail(exitUsage, "--out %s exists; give another name, or --force to overwrite it", out)
		}
	}
	dir := filepath.Dir(out)
	st, err := os.Stat(dir)
	if err != nil || !st.IsDir() {
		return fail(exitUsage, "--out %s: folder %s does not exist", out, dir)
	}
	probe, err := os.CreateTemp(dir, ".framepack-out-check-*")
	if err != nil {
		return fail(exitUsage, "--out %s: cannot write in %s: %v", out, dir, err)
	}
	name := probe.Name()
	probe.Close()
	os.Remove(name)
	return nil
}
