package main

import (
	"context"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/workerkit"
)

func TestCPUName(t *testing.T) {
	tests := []struct {
		name, cpuinfo, want string
	}{
		{"x86", "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD Ryzen 9 7950X 16-Core Processor\nflags\t\t: fpu\n", "AMD Ryzen 9 7950X 16-Core Processor"},
		{"arm hardware", "processor\t: 0\nBogoMIPS\t: 50.00\n\nHardware\t: BCM2835\nModel\t\t: Raspberry Pi 4\n", "BCM2835"},
		{"arm model only", "processor\t: 0\nModel\t\t: Raspberry Pi 4 Model B\n", "Raspberry Pi 4 Model B"},
		{"empty model name", "model name\t:\n", "cpu"},
		{"nothing", "", "cpu"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := cpuName(strings.NewReader(tt.cpuinfo), "cpu"); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestProbeInProcess exercises the probe without a process boundary (nil beacon).
func TestProbeInProcess(t *testing.T) {
	p := newProbe(&workerkit.Kit{Name: "probe"})
	ctx := t.Context()
	resp, err := p.Probe(ctx, &workerkit.ProbeRequest{Backend: "auto", AllocateBytes: 1 << 20, Env: map[string]string{"FRAMEPACK_PROBE_TEST_ENV": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Backend != "cpu" || !strings.HasPrefix(resp.DriverVersion, "linux ") || len(resp.Devices) != 1 || !resp.Allocate.Succeeded {
		t.Fatalf("probe: %+v", resp)
	}
	huge, err := p.Probe(ctx, &workerkit.ProbeRequest{AllocateBytes: resp.Devices[0].TotalMemoryBytes + 1})
	if err != nil || huge.Allocate.Succeeded || !strings.Contains(huge.Allocate.Error, "exceed") {
		t.Fatalf("allocation beyond total memory: %+v, %v", huge.Allocate, err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if r, _ := p.Probe(cancelled, &workerkit.ProbeRequest{AllocateBytes: 1 << 20}); r.Allocate.Succeeded {
		t.Fatal("allocation under a cancelled context succeeded")
	}
	st, err := p.Stats(ctx)
	if err != nil || st.HostRSSBytes == 0 || st.AllocatorPeakBytes != 1<<20 {
		t.Fatalf("stats: %+v, %v", st, err)
	}
	if _, err := p.Run(ctx, &workerkit.RunRequest{}, nil); workerkit.CodeOf(err) != workerkit.CodeInvalidArgument {
		t.Fatalf("run: %v", err)
	}
}
