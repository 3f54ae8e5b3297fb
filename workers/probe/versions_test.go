package main

import (
	"testing"

	"github.com/framepackd/framepackd/internal/gpuversion"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// TestProbeRuntimeVersions: the cpu reports no GPU runtime; a faked pair (through the probe
// request's environment, as a test's fault plan passes it) comes back as reported.
func TestProbeRuntimeVersions(t *testing.T) {
	t.Setenv(gpuversion.EnvFake, "") // restored after the probe sets it
	p := newProbe(&workerkit.Kit{Name: "probe"})
	resp, err := p.Probe(t.Context(), &workerkit.ProbeRequest{Backend: "cpu"})
	if err != nil || resp.Runtime != nil {
		t.Fatalf("cpu: %+v %v", resp, err)
	}
	resp, err = p.Probe(t.Context(), &workerkit.ProbeRequest{Backend: "cpu", Env: map[string]string{gpuversion.EnvFake: "cuda:12.8/12.4"}})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Runtime; r == nil || r.Backend != "cuda" || r.RuntimeVersion != "12.8" || r.DriverVersion != "12.4" || r.RuntimeSource != gpuversion.EnvFake {
		t.Fatalf("faked versions: %+v", resp.Runtime)
	}
	if _, err := p.Probe(t.Context(), &workerkit.ProbeRequest{Backend: "cpu", Env: map[string]string{gpuversion.EnvFake: "cuda:x/1"}}); workerkit.CodeOf(err) != workerkit.CodeInvalidArgument {
		t.Fatalf("bad fake: %v", err)
	}
}
