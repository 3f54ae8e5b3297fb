package cluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/testbin"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
)

// e2eAckWait is the daemons' --cluster-ack-wait: how soon a killed daemon's job is taken over.
const e2eAckWait = 5 * time.Second

// daemon is one framepackd process of the test cluster.
type daemon struct {
	node   string
	cmd    *exec.Cmd
	logs   *testbin.Output
	socket string
	conn   *grpc.ClientConn
	jobs   framepackv1.JobServiceClient
}

// startDaemons builds framepackd and the workers and starts n daemons in the cluster at url,
// each with one cpu lane and the tiny test models, and waits until each serves.
func startDaemons(t *testing.T, url string, n int) []*daemon {
	t.Helper()
	root, err := parity.Root()
	if err != nil {
		t.Fatal(err)
	}
	bin := testbin.Build(t, "./cmd/framepackd")
	dir, err := os.MkdirTemp("", "fpcl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	workers := filepath.Join(dir, "workers")
	if err := os.MkdirAll(workers, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"probe", "textenc", "vae", "clipvision", "transformer"} {
		if err := os.Symlink(testbin.Build(t, "./workers/"+w), filepath.Join(workers, w)); err != nil {
			t.Fatal(err)
		}
	}
	var out []*daemon
	for i := range n {
		d := &daemon{node: fmt.Sprintf("node%d", i), logs: &testbin.Output{}, socket: filepath.Join(dir, fmt.Sprintf("d%d.sock", i))}
		d.cmd = exec.Command(bin, "--cluster", url, "--cluster-node", d.node, "--cluster-ack-wait", e2eAckWait.String(),
			"--state", filepath.Join(dir, d.node), "--socket", d.socket, "--shm-root", filepath.Join(dir, d.node+"-shm"),
			"--workers-dir", workers, "--models", filepath.Join(root, "models"), "--backend", "cpu", "--lanes", "cpu",
			"--grace", "2s", "--log-format", "json", "--log-level", "info")
		d.cmd.Stderr = d.logs
		if err := d.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if d.cmd.ProcessState == nil {
				_ = d.cmd.Process.Kill()
				_ = d.cmd.Wait()
			}
			if t.Failed() {
				t.Logf("%s logs:\n%s", d.node, d.logs.String())
			}
		})
		if d.conn, err = grpc.NewClient(api.Addr{Network: "unix", Address: d.socket}.Target(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.conn.Close() })
		d.jobs = framepackv1.NewJobServiceClient(d.conn)
		out = append(out, d)
	}
	for _, d := range out {
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		resp, err := healthpb.NewHealthClient(d.conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		cancel()
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("%s not serving: %v %v\nlogs:\n%s", d.node, resp, err, d.logs.String())
		}
	}
	return out
}

// e2eSpec is a two-section job on the tiny models at resolution 96 with two steps a section.
func e2eSpec() *framepackv1.JobSpec {
	return &framepackv1.JobSpec{Prompt: "a cat walks on the grass", Seed: proto.Int64(31337), TotalSecondLength: 0.8, LatentWindowSize: 3,
		Steps: 2, Resolution: 96, UseTeacache: proto.Bool(false)}
}

// TestClusterTakeOverAfterKill runs three framepackd daemons on one embedded NATS JetStream
// server: three identical jobs, each submitted through another daemon, spread over the three;
// the daemon running the first job is killed (SIGKILL) after its first section, and the job is
// taken over by another daemon, which resumes it from the checkpoint in the cluster: every job
// succeeds once, the killed one with the same final history, byte for byte, as the undisturbed
// ones, and its video reaches the client through a daemon that did not make it.
func TestClusterTakeOverAfterKill(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three daemons and real workers")
	}
	url := natsServer(t)
	ds := startDaemons(t, url, 3)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	image, err := os.ReadFile(filepath.Join(moduleRoot(t), "testdata", "demo", "start.png"))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range ds { // any daemon accepts a submit
		resp, err := d.jobs.SubmitJob(ctx, &framepackv1.SubmitJobRequest{Image: image, Spec: e2eSpec()})
		if err != nil {
			t.Fatalf("submit through %s: %v", d.node, err)
		}
		ids = append(ids, resp.GetJob().GetId())
	}

	// The jobs spread: one per daemon (each has one lane and takes a job only when it is free).
	nodeOf := map[string]string{}
	deadline := time.Now().Add(3 * time.Minute)
	for len(nodeOf) < len(ids) {
		if time.Now().After(deadline) {
			t.Fatalf("jobs did not start on three daemons: %v", nodeOf)
		}
		for _, id := range ids {
			job, err := ds[0].jobs.GetJob(ctx, &framepackv1.GetJobRequest{JobId: id})
			if err != nil {
				t.Fatal(err)
			}
			if job.GetJob().GetState() == framepackv1.JobState_JOB_STATE_RUNNING {
				node, _, _ := strings.Cut(job.GetJob().GetLane(), "/")
				nodeOf[id] = node
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	seen := map[string]bool{}
	for _, n := range nodeOf {
		seen[n] = true
	}
	if len(seen) != 3 {
		t.Fatalf("three jobs ran on %d daemons: %v", len(seen), nodeOf)
	}
	victimJob := ids[0]
	var victim, watcher *daemon
	for _, d := range ds {
		if d.node == nodeOf[victimJob] {
			victim = d
		} else if watcher == nil {
			watcher = d
		}
	}

	// Follow the victim's job through another daemon; kill its daemon after section 0.
	killed := false
	_, err = watchJob(ctx, watcher.jobs, victimJob, func(ev *framepackv1.JobEvent) bool {
		if sv := ev.GetSectionVideo(); sv != nil && sv.GetSectionIndex() == 0 && !ev.GetReplay() {
			if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Errorf("kill %s: %v", victim.node, err)
			}
			killed = true
			return false
		}
		return true
	})
	if !killed {
		t.Fatalf("job %s ended before its first section video: %v", victimJob, err)
	}
	_ = victim.cmd.Wait()
	t.Logf("killed %s (running job %s) after section 0", victim.node, victimJob)

	// Every job ends, watched through a living daemon; the victim's on another daemon.
	for _, id := range ids {
		last, err := watchJob(ctx, watcher.jobs, id, nil)
		if err != nil {
			t.Fatalf("watch %s: %v", id, err)
		}
		if last.GetJobFinished() == nil {
			t.Fatalf("job %s ended with %v", id, last)
		}
	}
	job, err := watcher.jobs.GetJob(ctx, &framepackv1.GetJobRequest{JobId: victimJob})
	if err != nil {
		t.Fatal(err)
	}
	node, _, _ := strings.Cut(job.GetJob().GetLane(), "/")
	if node == victim.node || node == "" {
		t.Fatalf("killed daemon's job finished on lane %q", job.GetJob().GetLane())
	}
	t.Logf("job %s taken over by %s", victimJob, node)

	// Look into the cluster as a daemon does.
	obs := join(t, url, "observer", e2eAckWait)
	total := int(job.GetJob().GetProgress().GetTotalSections())
	final := map[string][]byte{}
	for _, id := range ids {
		// Done once: one terminal event in the job's log, and the job's queue message acked.
		evs := storedEvents(t, obs, id)
		finished, sectionZero := 0, 0
		for _, ev := range evs {
			if ev.GetJobFinished() != nil || ev.GetJobFailed() != nil || ev.GetJobCancelled() != nil {
				finished++
			}
			if sv := ev.GetSectionVideo(); sv != nil && sv.GetSectionIndex() == 0 {
				sectionZero++
			}
		}
		if finished != 1 {
			t.Errorf("job %s has %d terminal events", id, finished)
		}
		if id == victimJob && sectionZero != 1 {
			t.Errorf("the taken-over job wrote section 0 %d times: it did not resume from its checkpoint", sectionZero)
		}
		cp, err := obs.store.Checkpoint(id)
		if err != nil || cp == nil || cp.Section != total-1 {
			t.Fatalf("job %s checkpoint %+v (%v), want section %d", id, cp, err, total-1)
		}
		final[id] = objectBytes(t, obs, id, cp.Files["section"])
	}
	for _, id := range ids[1:] {
		if !bytes.Equal(final[victimJob], final[id]) {
			t.Errorf("taken-over job %s's final history differs from undisturbed job %s's (%d and %d bytes)", victimJob, id, len(final[victimJob]), len(final[id]))
		}
	}
	info, err := obs.queue.cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumPending != 0 || info.NumAckPending != 0 {
		t.Errorf("queue not empty after every job ended: %d pending, %d unacknowledged", info.NumPending, info.NumAckPending)
	}

	// The video through a daemon that did not make it.
	var reader *daemon
	for _, d := range ds {
		if d != victim && d.node != node {
			reader = d
		}
	}
	video := artifact(t, ctx, reader.jobs, victimJob)
	if len(video) < 8 || string(video[4:8]) != "ftyp" {
		t.Errorf("video through %s: %d bytes, not an MP4", reader.node, len(video))
	}
}

// moduleRoot is the repository root.
func moduleRoot(t *testing.T) string {
	t.Helper()
	r, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// watchJob streams job id's events to fn until the terminal event (returned) or fn says stop.
func watchJob(ctx context.Context, c framepackv1.JobServiceClient, id string, fn func(*framepackv1.JobEvent) bool) (*framepackv1.JobEvent, error) {
	stream, err := c.WatchJob(ctx, &framepackv1.WatchJobRequest{JobId: id})
	if err != nil {
		return nil, err
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		if fn != nil && !fn(ev) {
			return ev, nil
		}
		if ev.GetJobFinished() != nil || ev.GetJobFailed() != nil || ev.GetJobCancelled() != nil {
			return ev, nil
		}
	}
}

// storedEvents returns every event the cluster stored for job id.
func storedEvents(t *testing.T, c *Cluster, id string) []*framepackv1.JobEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cons, err := c.js.OrderedConsumer(ctx, c.events.names.eventsStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{c.events.subject(id)}})
	if err != nil {
		t.Fatal(err)
	}
	var out []*framepackv1.JobEvent
	for {
		batch, err := cons.FetchNoWait(100)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			ev := &framepackv1.JobEvent{}
			if err := proto.Unmarshal(m.Data(), ev); err != nil {
				t.Fatal(err)
			}
			out = append(out, ev)
			n++
		}
		if n == 0 {
			return out
		}
	}
}

// objectBytes reads a job file from the cluster's object store.
func objectBytes(t *testing.T, c *Cluster, id, rel string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b, err := c.store.obs.GetBytes(ctx, objectName(id, rel))
	if err != nil {
		t.Fatalf("object %s of job %s: %v", rel, id, err)
	}
	return b
}

// artifact downloads a job's video over the API.
func artifact(t *testing.T, ctx context.Context, c framepackv1.JobServiceClient, id string) []byte {
	t.Helper()
	stream, err := c.GetArtifact(ctx, &framepackv1.GetArtifactRequest{JobId: id})
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("get artifact of %s: %v", id, err)
		}
		out = append(out, resp.GetData()...)
	}
}
