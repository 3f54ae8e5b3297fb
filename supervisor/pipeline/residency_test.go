package pipeline_test

import (
	"testing"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// TestResidencyKeepsSectionWorkers runs the pipeline case with residency on and a budget that
// fits: once the transformer's and the VAE's footprints are measured in the section loop (the
// first section's transformer and decode), both stay alive between sections and later stages
// reuse them; the frames are the same as without residency (the
// fixture's), and every worker is gone when the job ends.
func TestResidencyKeepsSectionWorkers(t *testing.T) {
	jc := firstCase(t)
	workers := buildWorkers(t)
	o := newOpts(t, workers)
	o.Residency = true
	var stages stageLog
	o.onStage = stages.onStage
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
	stages.mu.Lock()
	var reused, kept int
	for _, r := range stages.records {
		if r.Reused {
			reused++
			if r.SpawnToReady != 0 || r.Load != 0 {
				t.Errorf("reused %s section %d spawned or loaded: %+v", r.Name, r.Section, r)
			}
		}
		if r.Kept {
			kept++
			if r.Stage != framepackv1.Stage_STAGE_TRANSFORMER && r.Stage != framepackv1.Stage_STAGE_VAE_DECODE {
				t.Errorf("%s kept resident", r.Name)
			}
		}
	}
	stages.mu.Unlock()
	if total > 1 && (reused == 0 || kept == 0) {
		t.Fatalf("%d stages kept, %d reused in %d sections", kept, reused, total)
	}
	t.Logf("case %s with residency: %d stages kept a worker, %d reused one", jc.c.Name, kept, reused)
	checkOutputs(t, jc, o.State, job, total)
}
