package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"golang.org/x/sys/unix"
)

// display shows a job's progress on stderr: on a terminal, one line redrawn in place (stage,
// section, step i/n or the VAE decode's runs i/n, a bar, ETA) with notable events printed
// above it; otherwise plain lines, sampling steps and decode progress at most every
// stepEvery.
type display struct {
	w     io.Writer
	tty   bool
	width func() int
	quiet bool
	now   func() time.Time

	id               string
	sections         uint32
	stage            framepackv1.Stage
	section          uint32
	step, steps      uint32
	runs, runsTotal  uint32 // model runs (tiles, chunks of frames) of a VAE decode
	fraction         float32
	eta              time.Duration
	drawn            bool // a progress line is on screen (tty)
	lastStepLine     time.Time
	attached         bool      // the first snapshot was shown
	shownUntil       time.Time // events up to this time were shown (a reconnect replays them)
	seenSectionVideo map[uint32]bool
	// getHint is the command that downloads the job's video so far ("framepack get ID"):
	// a section's MP4 on the server is removed when the next one is written, so its path is
	// not worth printing.
	getHint string
}

// stepEvery is how often plain output reports sampling steps.
const stepEvery = 10 * time.Second

func newDisplay(e *env, quiet bool) *display {
	return &display{w: e.stderr, tty: e.stderrTTY, width: e.width, quiet: quiet, now: time.Now, seenSectionVideo: map[uint32]bool{}}
}

func stageName(s framepackv1.Stage) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s.String(), "STAGE_")), "_", " ")
}

func perSection(s framepackv1.Stage) bool {
	switch s {
	case framepackv1.Stage_STAGE_TRANSFORMER, framepackv1.Stage_STAGE_VAE_DECODE, framepackv1.Stage_STAGE_WRITE_VIDEO:
		return true
	}
	return false
}

// line prints a line that stays (above the progress line on a terminal).
func (d *display) line(format string, args ...any) {
	if d.quiet {
		return
	}
	if d.tty && d.drawn {
		fmt.Fprint(d.w, "\r\033[K")
		d.drawn = false
	}
	fmt.Fprintf(d.w, format+"\n", args...)
	d.draw()
}

// note prints a remark that is not a job event.
func (d *display) note(msg string) { d.line("%s", msg) }

func (d *display) sectionLabel() string {
	if d.sections == 0 {
		return ""
	}
	return fmt.Sprintf("section %d/%d", d.section+1, d.sections)
}

func roundDur(x time.Duration) time.Duration {
	switch {
	case x >= time.Hour:
		return x.Round(time.Minute)
	case x >= time.Minute:
		return x.Round(time.Second)
	}
	return x.Round(100 * time.Millisecond)
}

// draw redraws the progress line (terminal only).
func (d *display) draw() {
	if d.quiet || !d.tty || d.stage == framepackv1.Stage_STAGE_UNSPECIFIED {
		return
	}
	var b strings.Builder
	if l := d.sectionLabel(); l != "" && perSection(d.stage) {
		b.WriteString(l + "  ")
	}
	b.WriteString(stageName(d.stage))
	if d.stage == framepackv1.Stage_STAGE_TRANSFORMER && d.steps > 0 {
		fmt.Fprintf(&b, " step %d/%d", d.step, d.steps)
	}
	if d.stage == framepackv1.Stage_STAGE_VAE_DECODE && d.runsTotal > 0 {
		fmt.Fprintf(&b, " %d/%d", d.runs, d.runsTotal)
	}
	tail := fmt.Sprintf(" %3.0f%%", 100*d.fraction)
	if d.eta > 0 {
		tail += "  ETA " + roundDur(d.eta).String()
	}
	width := 80
	if d.width != nil {
		if w := d.width(); w > 20 {
			width = w
		}
	}
	barLen := width - len([]rune(b.String())) - len(tail) - 5
	if barLen > 40 {
		barLen = 40
	}
	if barLen >= 5 {
		b.WriteString("  " + bar(float64(d.fraction), barLen))
	}
	b.WriteString(tail)
	s := []rune(b.String())
	if len(s) > width-1 {
		s = s[:width-1]
	}
	fmt.Fprint(d.w, "\r\033[K"+string(s))
	d.drawn = true
}

// done ends the progress line.
func (d *display) done() {
	if d.tty && d.drawn && !d.quiet {
		fmt.Fprint(d.w, "\r\033[K")
		d.drawn = false
	}
}

func (d *display) progress(p *framepackv1.JobProgress) {
	if p == nil {
		return
	}
	if p.GetTotalSections() > 0 {
		d.sections = p.GetTotalSections()
	}
	d.stage, d.section, d.step, d.fraction = p.GetStage(), p.GetSectionIndex(), p.GetStep(), p.GetFraction()
	if p.GetTotalSteps() > 0 {
		d.steps = p.GetTotalSteps()
	}
	if p.GetEta() != nil {
		d.eta = p.GetEta().AsDuration()
	}
}

// event shows one job event. Events already shown before a reconnect (the server replays the
// history) update the state without printing again.
func (d *display) event(ev *framepackv1.JobEvent) {
	if _, snap := ev.GetEvent().(*framepackv1.JobEvent_Snapshot); !snap && ev.GetTime() != nil {
		t := ev.GetTime().AsTime()
		if !t.After(d.shownUntil) {
			q := d.quiet
			d.quiet = true
			d.show(ev)
			d.quiet = q
			return
		}
		d.shownUntil = t
	}
	d.show(ev)
}

func (d *display) show(ev *framepackv1.JobEvent) {
	switch e := ev.GetEvent().(type) {
	case *framepackv1.JobEvent_Snapshot:
		// The job's history follows the snapshot and rebuilds the progress from the start.
		job := e.Snapshot
		if d.sections == 0 {
			d.sections = uint32(sectionsOf(job))
		}
		if d.steps == 0 {
			d.steps = job.GetSpec().GetSteps()
		}
		if !d.attached {
			d.attached = true
			d.line("job %s: %s", job.GetId(), stateName(job.GetState()))
		}
		return
	case *framepackv1.JobEvent_StageStarted:
		s := e.StageStarted
		d.stage = s.GetStage()
		if perSection(d.stage) {
			d.section = s.GetSectionIndex()
		}
		if d.stage == framepackv1.Stage_STAGE_TRANSFORMER {
			d.step = 0
		}
		d.runs, d.runsTotal = 0, 0
		if !d.tty {
			label := stageName(d.stage)
			if perSection(d.stage) && d.sections > 0 {
				label = d.sectionLabel() + ": " + label
			}
			if s.GetAttempt() > 1 {
				label += fmt.Sprintf(" (attempt %d)", s.GetAttempt())
			}
			d.line("%s started", label)
		}
		d.draw()
	case *framepackv1.JobEvent_StageFinished:
		d.draw()
	case *framepackv1.JobEvent_SamplingStep:
		s := e.SamplingStep
		d.stage = framepackv1.Stage_STAGE_TRANSFORMER
		d.section, d.step, d.steps = s.GetSectionIndex(), s.GetStep(), s.GetTotalSteps()
		switch {
		case s.GetFraction() > 0:
			d.fraction = max(d.fraction, s.GetFraction())
		case d.sections > 0 && d.steps > 0:
			f := (float32(d.section) + float32(d.step)/float32(d.steps)) / float32(d.sections)
			d.fraction = max(d.fraction, f)
		}
		if s.GetEta() != nil {
			d.eta = s.GetEta().AsDuration()
		}
		d.plainProgress(d.step == d.steps, fmt.Sprintf("step %d/%d", d.step, d.steps))
		d.draw()
	case *framepackv1.JobEvent_StageProgress:
		p := e.StageProgress
		d.stage = p.GetStage()
		if perSection(d.stage) {
			d.section = p.GetSectionIndex()
		}
		d.runs, d.runsTotal = p.GetDone(), p.GetTotal()
		d.fraction = max(d.fraction, p.GetFraction())
		if p.GetEta() != nil {
			d.eta = p.GetEta().AsDuration()
		}
		d.plainProgress(d.runs == d.runsTotal, fmt.Sprintf("%s %d/%d", stageName(d.stage), d.runs, d.runsTotal))
		d.draw()
	case *framepackv1.JobEvent_SectionVideo:
		v := e.SectionVideo
		d.section = v.GetSectionIndex()
		if d.sections > 0 {
			d.fraction = max(d.fraction, float32(d.section+1)/float32(d.sections))
		}
		if !d.seenSectionVideo[v.GetSectionIndex()] {
			d.seenSectionVideo[v.GetSectionIndex()] = true
			msg := fmt.Sprintf("%s: video so far: %d frames", d.sectionLabel(), v.GetFrameCount())
			if d.getHint != "" {
				msg += " (download: " + d.getHint + ")"
			}
			d.line("%s", msg)
		}
	case *framepackv1.JobEvent_Retry:
		a := e.Retry.GetAttempt()
		msg := fmt.Sprintf("retry: %s attempt %d: %s", stageName(a.GetStage()), a.GetAttempt(), className(a.GetClass()))
		if a.GetMessage() != "" {
			msg += ": " + a.GetMessage()
		}
		if a.GetChange() != "" {
			msg += "; next: " + a.GetChange()
		}
		d.line("%s", msg)
	case *framepackv1.JobEvent_Fallback:
		f := e.Fallback
		d.line("conv fallback in %s: %s -> %s for %s (%s)", stageName(f.GetStage()),
			strings.ToLower(strings.TrimPrefix(f.GetFromTier().String(), "CONV_TIER_")),
			strings.ToLower(strings.TrimPrefix(f.GetToTier().String(), "CONV_TIER_")), f.GetShapeKey(), f.GetReason())
	case *framepackv1.JobEvent_JobFinished:
		d.fraction = 1
		d.eta = 0
		r := e.JobFinished.GetResult()
		d.done()
		d.line("job %s finished: %s (%d frames, %s)", ev.GetJobId(), r.GetVideoPath(), r.GetFrameCount(), roundDur(r.GetDuration().AsDuration()))
		d.done()
	case *framepackv1.JobEvent_JobFailed:
		d.done()
		d.line("job %s failed", ev.GetJobId())
		d.done()
	case *framepackv1.JobEvent_JobCancelled:
		d.done()
		d.line("job %s cancelled", ev.GetJobId())
		d.done()
	}
}

// plainProgress prints a progress line without a terminal ("section 1/2: what, 40% done, ETA
// 1m"): when last (the stage's final step or run), else at most every stepEvery.
func (d *display) plainProgress(last bool, what string) {
	if d.tty || d.quiet {
		return
	}
	now := d.now()
	if !last && now.Sub(d.lastStepLine) < stepEvery {
		return
	}
	d.lastStepLine = now
	msg := fmt.Sprintf("%s: %s, %.0f%% done", d.sectionLabel(), what, 100*d.fraction)
	if d.eta > 0 {
		msg += ", ETA " + roundDur(d.eta).String()
	}
	d.line("%s", msg)
}

// isTerminal reports whether f is a terminal.
func isTerminal(f interface{ Fd() uintptr }) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// terminalWidth returns f's width in columns, 80 when unknown.
func terminalWidth(f interface{ Fd() uintptr }) int {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil || ws.Col == 0 {
		return 80
	}
	return int(ws.Col)
}

// bar is a progress bar of n cells, frac (clamped to [0, 1]) of them filled: "[####----]".
func bar(frac float64, n int) string {
	fill := int(float64(n) * min(max(frac, 0), 1))
	return "[" + strings.Repeat("#", fill) + strings.Repeat("-", n-fill) + "]"
}
