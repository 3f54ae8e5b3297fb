package workerkit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/sirupsen/logrus"
)

// hclogBridge is an hclog.Logger that writes to logrus. go-plugin logs through it, including
// the worker's stderr lines, which it parses when they are hclog JSON (see workerFormatter).
type hclogBridge struct {
	src  *entrySource // shared by every logger derived from this one
	name string
	args []any
}

// entrySource is the logrus entry behind a family of bridges; it can gain fields (the pid)
// after go-plugin has taken the logger.
type entrySource struct {
	mu sync.Mutex // mu protects e
	e  *logrus.Entry

	// killed, when set, reports whether the supervisor itself killed the worker: then the exit
	// go-plugin reports as an error ("signal: killed") is the normal teardown.
	killed func() bool
}

// exitMessage is what go-plugin logs when the plugin process has ended (at error level when
// the exit status is not 0).
const exitMessage = "plugin process exited"

func (s *entrySource) get() *logrus.Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.e
}

func (s *entrySource) set(e *logrus.Entry) {
	s.mu.Lock()
	s.e = e
	s.mu.Unlock()
}

var _ hclog.Logger = (*hclogBridge)(nil)

func newHclogBridge(e *logrus.Entry) *hclogBridge { return &hclogBridge{src: &entrySource{e: e}} }

func (b *hclogBridge) entry(args []any) *logrus.Entry {
	e := b.src.get()
	if b.name != "" {
		e = e.WithField("component", b.name)
	}
	all := append(append([]any(nil), b.args...), args...)
	fields := logrus.Fields{}
	for i := 0; i+1 < len(all); i += 2 {
		k := fmt.Sprint(all[i])
		if k == "timestamp" || k == "@module" || k == "@caller" {
			continue
		}
		fields[k] = all[i+1]
	}
	if len(all)%2 == 1 {
		fields["extra"] = all[len(all)-1]
	}
	return e.WithFields(fields)
}

// Log writes msg at level with key/value args. go-plugin's error for the exit of a worker the
// supervisor killed is logged at debug level: every normal teardown ends that way.
func (b *hclogBridge) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Error && msg == exitMessage && b.src.killed != nil && b.src.killed() {
		level = hclog.Debug
	}
	e := b.entry(args)
	switch level {
	case hclog.Trace:
		e.Trace(msg)
	case hclog.Debug, hclog.NoLevel:
		e.Debug(msg)
	case hclog.Info:
		e.Info(msg)
	case hclog.Warn:
		e.Warn(msg)
	case hclog.Error:
		e.Error(msg)
	}
}

// Trace logs at trace level.
func (b *hclogBridge) Trace(msg string, args ...any) { b.Log(hclog.Trace, msg, args...) }

// Debug logs at debug level.
func (b *hclogBridge) Debug(msg string, args ...any) { b.Log(hclog.Debug, msg, args...) }

// Info logs at info level.
func (b *hclogBridge) Info(msg string, args ...any) { b.Log(hclog.Info, msg, args...) }

// Warn logs at warn level.
func (b *hclogBridge) Warn(msg string, args ...any) { b.Log(hclog.Warn, msg, args...) }

// Error logs at error level.
func (b *hclogBridge) Error(msg string, args ...any) { b.Log(hclog.Error, msg, args...) }

// IsTrace reports whether trace messages are written.
func (b *hclogBridge) IsTrace() bool { return b.src.get().Logger.IsLevelEnabled(logrus.TraceLevel) }

// IsDebug reports whether debug messages are written.
func (b *hclogBridge) IsDebug() bool { return b.src.get().Logger.IsLevelEnabled(logrus.DebugLevel) }

// IsInfo reports whether info messages are written.
func (b *hclogBridge) IsInfo() bool { return b.src.get().Logger.IsLevelEnabled(logrus.InfoLevel) }

// IsWarn reports whether warnings are written.
func (b *hclogBridge) IsWarn() bool { return b.src.get().Logger.IsLevelEnabled(logrus.WarnLevel) }

// IsError reports whether errors are written.
func (b *hclogBridge) IsError() bool { return b.src.get().Logger.IsLevelEnabled(logrus.ErrorLevel) }

// ImpliedArgs returns the args added by With.
func (b *hclogBridge) ImpliedArgs() []any { return b.args }

// With returns a logger that adds args to every message.
func (b *hclogBridge) With(args ...any) hclog.Logger {
	c := *b
	c.args = append(append([]any(nil), b.args...), args...)
	return &c
}

// Name returns the logger's name.
func (b *hclogBridge) Name() string { return b.name }

// Named returns a logger with name appended to this one's.
func (b *hclogBridge) Named(name string) hclog.Logger {
	c := *b
	if c.name != "" {
		c.name += "." + name
	} else {
		c.name = name
	}
	return &c
}

// ResetNamed returns a logger with exactly name.
func (b *hclogBridge) ResetNamed(name string) hclog.Logger {
	c := *b
	c.name = name
	return &c
}

// SetLevel does nothing: the level is the logrus logger's.
func (b *hclogBridge) SetLevel(hclog.Level) {}

// GetLevel returns the logrus logger's level in hclog terms.
func (b *hclogBridge) GetLevel() hclog.Level {
	switch l := b.src.get().Logger.GetLevel(); {
	case l >= logrus.TraceLevel:
		return hclog.Trace
	case l >= logrus.DebugLevel:
		return hclog.Debug
	case l >= logrus.InfoLevel:
		return hclog.Info
	case l >= logrus.WarnLevel:
		return hclog.Warn
	default:
		return hclog.Error
	}
}

// StandardLogger returns a standard library logger writing at info level.
func (b *hclogBridge) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return log.New(b.StandardWriter(nil), "", 0)
}

// StandardWriter returns a writer whose lines are logged at info level.
func (b *hclogBridge) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return b.src.get().WriterLevel(logrus.InfoLevel)
}

// workerFormatter writes logrus entries as hclog JSON lines, which go-plugin on the supervisor
// side parses back into leveled log entries with fields.
type workerFormatter struct{}

// Format renders one entry as a JSON line with hclog's @level, @message and @timestamp keys.
func (workerFormatter) Format(e *logrus.Entry) ([]byte, error) {
	m := make(map[string]any, len(e.Data)+3)
	for k, v := range e.Data {
		if err, ok := v.(error); ok {
			v = err.Error()
		}
		m[k] = v
	}
	level := e.Level.String()
	switch e.Level {
	case logrus.WarnLevel:
		level = "warn"
	case logrus.FatalLevel, logrus.PanicLevel:
		level = "error"
	}
	m["@level"] = level
	m["@message"] = e.Message
	m["@timestamp"] = e.Time.Format("2006-01-02T15:04:05.000000Z07:00")
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(m); err != nil {
		return nil, fmt.Errorf("format log entry: %w", err)
	}
	return buf.Bytes(), nil
}

// stderrTail keeps the last error-like lines a worker wrote to stderr, for error messages
// ("worker exited: signal: killed; stderr: ...").
type stderrTail struct {
	mu      sync.Mutex // mu protects all fields
	partial []byte     // current unterminated line
	errs    []string   // last error-like lines
	last    []string   // last lines of any kind
}

const (
	tailErrLines = 8
	tailAnyLines = 4
	tailLineMax  = 400
)

// Write collects complete lines.
func (t *stderrTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.partial = append(t.partial, p...)
	for {
		i := bytes.IndexByte(t.partial, '\n')
		if i < 0 {
			break
		}
		t.add(string(t.partial[:i]))
		t.partial = t.partial[i+1:]
	}
	if len(t.partial) > 64<<10 { // a runaway line: keep its start
		t.add(string(t.partial[:tailLineMax]))
		t.partial = t.partial[:0]
	}
	return len(p), nil
}

// add records one line; caller holds mu.
func (t *stderrTail) add(line string) {
	line = strings.TrimSpace(line)
	if line == "" {
		return
	}
	line, isErr := readableLine(line)
	if len(line) > tailLineMax {
		line = line[:tailLineMax] + "…"
	}
	t.last = appendCapped(t.last, line, tailAnyLines)
	if isErr {
		t.errs = appendCapped(t.errs, line, tailErrLines)
	}
}

func appendCapped(s []string, v string, n int) []string {
	s = append(s, v)
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}

// errorWords mark a plain stderr line as error-like.
var errorWords = []string{"error", "panic", "fatal", "fail", "abort", "segmentation", "sigsegv", "sigbus", "killed", "out of memory", "oom", "cannot", "unable"}

// readableLine renders an hclog JSON line as "message key=value ..." and says whether a line
// reads as an error.
func readableLine(line string) (string, bool) {
	if strings.HasPrefix(line, "{") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			if msg, ok := m["@message"].(string); ok {
				level, _ := m["@level"].(string)
				var b strings.Builder
				b.WriteString(msg)
				for k, v := range m {
					if !strings.HasPrefix(k, "@") {
						fmt.Fprintf(&b, " %s=%v", k, v)
					}
				}
				return b.String(), level == "error"
			}
		}
	}
	low := strings.ToLower(line)
	for _, w := range errorWords {
		if strings.Contains(low, w) {
			return line, true
		}
	}
	return line, false
}

// Lines returns the last error-like lines, or the last lines of any kind when there were none.
func (t *stderrTail) Lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.errs) > 0 {
		return append([]string(nil), t.errs...)
	}
	return append([]string(nil), t.last...)
}
