package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/framepackd/framepackd/supervisor/watchdog"
)

// TestOpsFlags: the hang deadline, retry budget and VRAM-recovery wait are flags whose
// defaults are the watchdog's documented ones, reach each lane's watchdog configuration, and
// are checked.
func TestOpsFlags(t *testing.T) {
	var help bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, &help); err == nil {
		t.Fatal("-h: no error")
	}
	for _, want := range []string{"-hang-deadline-scale", "-op-deadline", "(default 5m0s)", "-stall-timeout", "(default 10m0s)",
		"-retries-per-stage", "(default 5)", "-retries-per-job", "(default 16)", "-vram-recovery-wait", "(default 5s)",
		"-retention-age", "-retention-bytes", "-disk-budget", "-min-free-disk", "-max-image-pixels", "-max-concurrent-decodes",
		"-keep-section-videos", "-socket-group"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("--help lacks %q", want)
		}
	}

	o, err := parseFlags([]string{"--hang-deadline-scale", "20", "--op-deadline", "1m", "--stall-timeout", "2m",
		"--retries-per-stage", "2", "--retries-per-job", "3", "--vram-recovery-wait", "30s"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var c watchdog.Config
	o.ops.apply(&c)
	if c.Deadlines.Scale != 20 || c.Deadlines.OpMin != time.Minute || c.Deadlines.Stall != 2*time.Minute ||
		c.Budget != (watchdog.Budget{PerStage: 2, PerJob: 3}) || c.Recovery.Timeout != 30*time.Second {
		t.Fatalf("watchdog config %+v %+v %+v", c.Deadlines, c.Budget, c.Recovery)
	}
	if len(c.Deadlines.Stages) == 0 {
		t.Fatal("stage deadlines lost")
	}
	for _, bad := range [][]string{{"--retries-per-stage", "0"}, {"--hang-deadline-scale", "0"}, {"--vram-recovery-wait", "0s"}} {
		var stderr bytes.Buffer
		if _, err := parseFlags(bad, &stderr); !errors.Is(err, errUsage) {
			t.Errorf("%v: %v", bad, err)
		}
	}
}
