package workerkit

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
)

func TestHclogBridge(t *testing.T) {
	log, hook := test.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	b := newHclogBridge(logrus.NewEntry(log).WithField("worker", "vae"))
	var l hclog.Logger = b
	l.Named("plugin").With("id", 7).Warn("slow start", "took", "3s")
	e := hook.LastEntry()
	if e.Level != logrus.WarnLevel || e.Message != "slow start" || e.Data["worker"] != "vae" || e.Data["component"] != "plugin" || e.Data["id"] != 7 || e.Data["took"] != "3s" {
		t.Fatalf("entry %+v %v", e, e.Data)
	}
	l.Trace("hidden")
	if hook.LastEntry().Message == "hidden" || l.IsTrace() || !l.IsDebug() || l.GetLevel() != hclog.Debug {
		t.Fatal("trace level leaked")
	}
	// The pid can arrive later and reaches loggers handed out before.
	named := l.Named("stderr")
	b.src.set(logrus.NewEntry(log).WithField("pid", 42))
	named.Error("boom")
	if e := hook.LastEntry(); e.Data["pid"] != 42 || e.Level != logrus.ErrorLevel {
		t.Fatalf("entry after pid: %v", e.Data)
	}
}

// TestWorkerLogLinesParse checks the worker's JSON lines read back as go-plugin parses them
// (hclog keys) and feed the stderr tail.
func TestWorkerLogLinesParse(t *testing.T) {
	var buf bytes.Buffer
	l := logrus.New()
	l.SetOutput(&buf)
	l.SetFormatter(workerFormatter{})
	l.WithError(errors.New("hipMalloc failed")).WithField("bytes", 10).Error("allocate weights")
	l.Warn("careful")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("lines: %q", lines)
	}
	for _, want := range []string{`"@level":"error"`, `"@message":"allocate weights"`, `"error":"hipMalloc failed"`, `"@timestamp":"`} {
		if !strings.Contains(lines[0], want) {
			t.Fatalf("%s lacks %s", lines[0], want)
		}
	}
	if !strings.Contains(lines[1], `"@level":"warn"`) {
		t.Fatalf("warn level: %s", lines[1])
	}
	if hclog.LevelFromString("warn") != hclog.Warn {
		t.Fatal("hclog does not read warn")
	}

	var tail stderrTail
	tail.Write(buf.Bytes())
	tail.Write([]byte("plain progress line\nfatal error: unexpected signal during runtime exe"))
	tail.Write([]byte("cution\n"))
	got := tail.Lines()
	if len(got) != 2 || !strings.HasPrefix(got[0], "allocate weights") || !strings.Contains(got[0], "error=hipMalloc failed") ||
		got[1] != "fatal error: unexpected signal during runtime execution" {
		t.Fatalf("tail: %q", got)
	}
}

func TestStderrTailKeepsLast(t *testing.T) {
	var tail stderrTail
	for i := 0; i < 20; i++ {
		tail.Write([]byte("error number " + string(rune('a'+i)) + "\n"))
	}
	got := tail.Lines()
	if len(got) != tailErrLines || got[len(got)-1] != "error number t" {
		t.Fatalf("tail: %q", got)
	}
	var quiet stderrTail
	quiet.Write([]byte("one\ntwo\nthree\nfour\nfive\n"))
	if got := quiet.Lines(); !slices.Equal(got, []string{"two", "three", "four", "five"}) {
		t.Fatalf("no error lines: %q", got)
	}
	var long stderrTail
	long.Write(bytes.Repeat([]byte("x"), 70<<10))
	if got := long.Lines(); len(got) != 1 || len(got[0]) > tailLineMax+4 {
		t.Fatalf("runaway line: %d lines", len(got))
	}
}

// TestHclogBridgeKilledExit checks that go-plugin's exit error is debug only while the
// supervisor's kill explains it.
func TestHclogBridgeKilledExit(t *testing.T) {
	tests := []struct {
		name   string
		killed bool
		msg    string
		want   logrus.Level
	}{
		{"killed by the supervisor", true, exitMessage, logrus.DebugLevel},
		{"died by itself", false, exitMessage, logrus.ErrorLevel},
		{"other error after the kill", true, "client", logrus.ErrorLevel},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log, hook := test.NewNullLogger()
			log.SetLevel(logrus.DebugLevel)
			b := newHclogBridge(logrus.NewEntry(log))
			b.src.killed = func() bool { return tc.killed }
			b.Named("plugin").Error(tc.msg, "error", "signal: killed")
			if e := hook.LastEntry(); e == nil || e.Level != tc.want || e.Data["error"] != "signal: killed" {
				t.Fatalf("entry %+v, want level %s", e, tc.want)
			}
		})
	}
}
