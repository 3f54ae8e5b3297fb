package pipeline_test

import (
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/framepackd/framepackd/internal/workerkit/workertest"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// residencyMemory is the test lane's device memory for the residency tests: with the default
// 6 GiB preserved and the 1 GiB reserve, a 9 GiB budget, in which every tiny model fits.
const residencyMemory = 16 << 30

// TestResidencyFromSectionZero: with residency on and a budget that holds every worker, the
// plan made before the first section keeps the transformer and the VAE from section 0: the
// transformer loads once, every decode runs in the VAE worker that encoded the start frame, no
// worker is killed for memory, every stage record says what was decided, the frames are the
// fixture's, and (keep-alive 0) every worker is gone when the job ends.
func TestResidencyFromSectionZero(t *testing.T) {
	jc := firstCase(t)
	workers := buildWorkers(t)
	o := newOpts(t, workers)
	o.Residency, o.DeviceMemory = true, residencyMemory
	d, err := newDaemon(o, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Kill()
	job, _ := runJob(t, jc, o.Socket)
	total := int(job.GetProgress().GetTotalSections())
	if err := waitNoWorkers(workers, 5*time.Second); err != nil {
		t.Fatalf("after the job: %v", err)
	}
	if err := shmEmpty(o.Shm); err != nil {
		t.Error(err)
	}
	var loads = map[string]int{}
	for _, r := range stageRecords(t, o.State, job.GetId()) {
		if r.Worker == "" {
			continue
		}
		if r.Residency == "" || r.CapBytes == 0 || len(r.Evicted) > 0 {
			t.Errorf("%s section %d: cap %d, residency %q, evicted %v", r.Name, r.Section, r.CapBytes, r.Residency, r.Evicted)
		}
		if !r.Kept {
			t.Errorf("%s section %d not kept: %s", r.Name, r.Section, r.Residency)
		}
		if !r.Reused {
			loads[r.Worker]++
		} else if r.SpawnToReady != 0 || r.Load != 0 {
			t.Errorf("reused %s section %d spawned or loaded", r.Name, r.Section)
		}
	}
	for _, m := range []string{"textenc", "vae", "clipvision", "transformer"} {
		if loads[m] != 1 {
			t.Errorf("%s loaded %d times in a %d-section job, want once", m, loads[m], total)
		}
	}
	checkOutputs(t, jc, o.State, job, total)
}

// TestKeepAliveAcrossJobs: with a keep-alive the next job reuses every worker the last one
// kept (no spawn, no load); a job whose budget cannot hold them (more memory preserved) has
// them killed to make room, keeps none after it (its keep_alive is 0), and still matches the
// fixture.
func TestKeepAliveAcrossJobs(t *testing.T) {
	jc := firstCase(t)
	workers := buildWorkers(t)
	o := newOpts(t, workers)
	o.Residency, o.DeviceMemory, o.KeepAlive = true, residencyMemory, time.Hour
	d, err := newDaemon(o, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Kill()
	first, _ := runJob(t, jc, o.Socket)
	kept := workertest.Processes(workers)
	if len(kept) != 4 {
		t.Fatalf("%d workers alive after a job with a keep-alive, want the 4 it kept", len(kept))
	}
	second, _ := runJob(t, jc, o.Socket)
	for _, r := range stageRecords(t, o.State, second.GetId()) {
		if r.Worker != "" && (!r.Reused || r.Load != 0) {
			t.Errorf("second job's %s section %d did not reuse a kept worker: %s", r.Name, r.Section, r.Residency)
		}
	}
	total := int(second.GetProgress().GetTotalSections())
	checkOutputs(t, jc, o.State, second, total)

	// A job that preserves nearly all of the lane's memory: its budget holds one worker at a
	// time, so the kept ones go.
	tight := jc
	tight.spec = proto.Clone(jc.spec).(*framepackv1.JobSpec)
	tight.spec.GpuMemoryPreservationGb = proto.Float32(float32(residencyMemory>>30) - 1.5)
	tight.spec.KeepAlive = durationpb.New(0)
	third, _ := runJob(t, tight, o.Socket)
	var evicted int
	for _, r := range stageRecords(t, o.State, third.GetId()) {
		evicted += len(r.Evicted)
		if r.Worker == "transformer" && r.Section > 0 && r.Reused {
			t.Errorf("tight job kept its transformer beside the vae: %s", r.Residency)
		}
	}
	if evicted < 4 {
		t.Errorf("tight job killed %d kept workers for memory, want at least the first job's 4", evicted)
	}
	if err := waitNoWorkers(workers, 5*time.Second); err != nil {
		t.Fatalf("after a job with keep_alive 0: %v", err)
	}
	checkOutputs(t, tight, o.State, third, int(third.GetProgress().GetTotalSections()))
	if first.GetId() == second.GetId() {
		t.Fatal("one job for two submits")
	}
}

// TestKeptWorkersDieWithDaemon: workers kept for the next job die with a daemon killed with
// SIGKILL (the parent-death signal; no orphan keeps memory), and a new daemon on the same state
// runs the next job with fresh workers.
func TestKeptWorkersDieWithDaemon(t *testing.T) {
	jc := firstCase(t)
	workers := buildWorkers(t)
	o := newOpts(t, workers)
	o.Residency, o.DeviceMemory, o.KeepAlive = true, residencyMemory, time.Hour
	proc := startDaemonProcess(t, o)
	runJob(t, jc, o.Socket)
	if n := len(workertest.Processes(workers)); n != 4 {
		t.Fatalf("%d workers alive after the job, want 4 kept", n)
	}
	if err := proc.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = proc.Wait()
	if err := waitNoWorkers(workers, 10*time.Second); err != nil {
		t.Fatalf("kept workers outlived their daemon: %v", err)
	}
	o.KeepAlive = 0 // this daemon's lane is never closed: keep nothing past the test
	d, err := newDaemon(o, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Kill()
	job, _ := runJob(t, jc, o.Socket)
	if err := waitNoWorkers(workers, 5*time.Second); err != nil {
		t.Fatalf("after the new daemon's job (keep-alive 0): %v", err)
	}
	for _, r := range stageRecords(t, o.State, job.GetId()) {
		if r.Worker != "" && r.Section <= 0 && r.Reused && r.Name == framepackv1.Stage_STAGE_TEXT_ENCODE.String() {
			t.Errorf("the new daemon's first stage reused a worker: %+v", r)
		}
	}
	checkOutputs(t, jc, o.State, job, int(job.GetProgress().GetTotalSections()))
}
