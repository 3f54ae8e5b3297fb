package web_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/httpapi/httpapitest"
	"github.com/framepackd/framepackd/supervisor/web"
)

// session is a headless chromium on the page of a test daemon, collecting console errors.
type session struct {
	t   *testing.T
	d   *httpapitest.Daemon
	ctx context.Context

	mu       sync.Mutex
	problems []string
}

// openPage starts chromium on a fresh daemon's page; console errors fail the test at its end.
func openPage(t *testing.T, opts httpapitest.Options) *session {
	t.Helper()
	exe := browser(t)
	opts.Page = web.Handler()
	s := &session{t: t, d: httpapitest.Start(t, opts)}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU)...)
	t.Cleanup(cancelA)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	s.ctx = ctx
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == "error" || strings.Contains(m.Text, "Content Security Policy") {
				s.mu.Lock()
				s.problems = append(s.problems, m.String())
				s.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, p := range s.problems {
			t.Errorf("console: %s", p)
		}
	})
	s.do("open the page", chromedp.Navigate(s.d.URL+"/"), 30*time.Second)
	s.wait("queue loaded", `document.getElementById('conn').textContent === 'connected'`, 10*time.Second)
	return s
}

// do runs one action within timeout, failing the test with what the page shows.
func (s *session) do(what string, a chromedp.Action[chromedp.Void], timeout time.Duration) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, timeout)
	defer cancel()
	if _, err := chromedp.Run(ctx, a); err != nil {
		page, _ := chromedp.Run(s.ctx, chromedp.Evaluate[string](`document.getElementById('progress-text').textContent + ' | ' +
			document.getElementById('failure').textContent + ' | ' + document.getElementById('submit-error').textContent`))
		s.t.Fatalf("%s: %v (page: %s)", what, err, page)
	}
}

// js runs a script.
func (s *session) js(what, script string) {
	s.t.Helper()
	s.do(what, chromedp.Evaluate[chromedp.Void](script), 5*time.Second)
}

// str evaluates a string expression.
func (s *session) str(expr string) string {
	s.t.Helper()
	v, err := chromedp.Run(s.ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		s.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// wait polls expr until it is true (an evaluation error counts as false).
func (s *session) wait(what, expr string, timeout time.Duration) {
	s.t.Helper()
	s.do(what, func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		var last error
		for {
			ok, err := chromedp.Evaluate[bool](expr)(ctx, tg)
			if err == nil && ok {
				return chromedp.Void{}, nil
			}
			if err != nil {
				last = err
			}
			select {
			case <-ctx.Done():
				return chromedp.Void{}, fmt.Errorf("%w (last evaluation error: %v)", ctx.Err(), last)
			case <-tick.C:
			}
		}
	}, timeout)
}

// upload sets the files of a file input.
func (s *session) upload(selector string, files ...string) {
	s.t.Helper()
	s.do("upload to "+selector, chromedp.SetUploadFiles(chromedp.CSS(selector), files), 10*time.Second)
}

// job returns the job in the live view.
func (s *session) job() *framepackv1.Job {
	s.t.Helper()
	id := s.str(`document.getElementById('live-id').textContent`)
	resp, err := s.d.Jobs.GetJob(s.t.Context(), &framepackv1.GetJobRequest{JobId: id})
	if err != nil {
		s.t.Fatalf("job %q of the live view: %v", id, err)
	}
	return resp.GetJob()
}

// tinyJob fills the form for a quick job on the tiny models: one section of 3 steps.
const tinyJob = `(() => {
	const set = (id, v) => { document.getElementById(id).value = v; };
	set('seconds', '0.4'); set('steps', '3'); set('resolution', '96'); set('window', '3'); set('seed', '7');
})()`

// TestPageMagCache submits a job with MagCache from the page: the MagCache settings appear with
// the choice, reach the job's spec, the job runs to its video and the live view's settings name
// the cache.
func TestPageMagCache(t *testing.T) {
	s := openPage(t, httpapitest.Options{})
	img, err := httpapitest.DemoImage()
	if err != nil {
		t.Fatal(err)
	}
	s.upload("#image", img)
	s.js("fill the form", tinyJob)
	if s.str(`String(document.querySelector('#cache-box .magcache').hidden)`) != "true" {
		t.Error("MagCache settings shown with TeaCache chosen")
	}
	s.js("choose MagCache", `(() => {
		const c = document.getElementById('cache'); c.value = 'magcache'; c.dispatchEvent(new Event('change'));
		document.getElementById('magcache-threshold').value = '0.3';
		document.getElementById('magcache-max-skips').value = '3';
		document.getElementById('magcache-retention').value = '0';
	})()`)
	s.wait("MagCache settings shown", `!document.querySelector('#cache-box .magcache').hidden`, 5*time.Second)
	s.do("submit", chromedp.Click(chromedp.CSS("#submit")), 5*time.Second)
	s.wait("job listed", `document.getElementById('live-id').textContent !== ''`, 20*time.Second)
	s.wait("finished", `document.getElementById('live-state').dataset.state === 'SUCCEEDED'`, 3*time.Minute)
	s.wait("settings name the cache", `document.getElementById('settings').textContent.includes('magcache')`, 10*time.Second)
	spec := s.job().GetSpec()
	if spec.GetCache() != "magcache" || spec.GetUseTeacache() || spec.GetMagcacheThreshold() != 0.3 ||
		spec.GetMagcacheMaxConsecutiveSkips() != 3 || spec.GetMagcacheRetentionRatio() != 0 {
		t.Errorf("the page's job spec: %v", spec)
	}
}

// TestPagePresets saves the form's settings as a preset from the page, loads them back into a
// changed form by choosing the preset, submits a job that records it, and deletes it.
func TestPagePresets(t *testing.T) {
	s := openPage(t, httpapitest.Options{})
	img, err := httpapitest.DemoImage()
	if err != nil {
		t.Fatal(err)
	}
	s.upload("#image", img)
	s.js("fill the form", tinyJob)
	s.js("name and save", `(() => {
		document.getElementById('cache').value = 'none';
		document.getElementById('preset-name').value = 'tiny quick';
		document.getElementById('preset-save').click();
	})()`)
	s.wait("saved", `document.getElementById('preset-status').textContent === 'saved "tiny quick"' && document.getElementById('preset').value === 'tiny quick'`, 10*time.Second)
	p, err := framepackv1.NewPresetServiceClient(s.d.Conn).GetPreset(t.Context(), &framepackv1.GetPresetRequest{Name: "tiny quick"})
	if err != nil || p.GetPreset().GetSpec().GetSteps() != 3 || p.GetPreset().GetSpec().GetCache() != "none" || p.GetPreset().GetSpec().GetResolution() != 96 {
		t.Fatalf("preset from the page: %v %v", p, err)
	}
	s.js("change the form, then choose the preset", `(() => {
		document.getElementById('steps').value = '40'; document.getElementById('cache').value = 'teacache';
		const sel = document.getElementById('preset'); sel.value = ''; sel.dispatchEvent(new Event('change'));
		sel.value = 'tiny quick'; sel.dispatchEvent(new Event('change'));
	})()`)
	s.wait("form filled from the preset", `document.getElementById('steps').value === '3' && document.getElementById('cache').value === 'none'`, 10*time.Second)
	s.do("submit", chromedp.Click(chromedp.CSS("#submit")), 5*time.Second)
	s.wait("job listed", `document.getElementById('live-id').textContent !== ''`, 20*time.Second)
	s.wait("settings name the preset", `document.getElementById('settings').textContent.includes('tiny quick')`, 10*time.Second)
	if spec := s.job().GetSpec(); spec.GetPreset() != "tiny quick" || spec.GetSteps() != 3 || spec.GetCache() != "none" {
		t.Errorf("the page's job: %v", spec)
	}
	s.js("delete", `document.getElementById('preset-delete').click()`)
	s.wait("deleted", `document.getElementById('preset-status').textContent === 'deleted "tiny quick"' && document.querySelectorAll('#preset option').length === 1`, 10*time.Second)
}

// TestPageBatch submits two start images at once from the page: one batch of two jobs with the
// form's settings, shown in the live view with its counts, cancelled with one button.
func TestPageBatch(t *testing.T) {
	s := openPage(t, httpapitest.Options{})
	img, err := httpapitest.DemoImage()
	if err != nil {
		t.Fatal(err)
	}
	second := filepath.Join(t.TempDir(), "second.png")
	raw, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(second, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	s.upload("#image", img, second)
	// Long enough (4 s of 20 steps) to be running or queued when the cancel lands.
	s.js("fill the form", tinyJob+`; (() => { document.getElementById('seconds').value = '4'; document.getElementById('steps').value = '20'; })()`)
	s.do("submit", chromedp.Click(chromedp.CSS("#submit")), 5*time.Second)
	s.wait("batch shown", `!document.getElementById('batch-box').hidden && document.getElementById('batch-summary').textContent.startsWith('2 jobs')`, 20*time.Second)
	id := s.str(`document.getElementById('batch-id').textContent`)
	b, err := framepackv1.NewBatchServiceClient(s.d.Conn).GetBatch(t.Context(), &framepackv1.GetBatchRequest{BatchId: id})
	if err != nil || len(b.GetBatch().GetJobs()) != 2 {
		t.Fatalf("batch %q from the page: %v %v", id, b, err)
	}
	names := map[string]bool{}
	for _, j := range b.GetBatch().GetJobs() {
		names[j.GetSpec().GetImageFilename()] = true
		if j.GetSpec().GetSteps() != 20 || j.GetSpec().GetResolution() != 96 {
			t.Errorf("batch job spec: %v", j.GetSpec())
		}
	}
	if !names["second.png"] || len(names) != 2 {
		t.Errorf("batch jobs' images %v", names)
	}
	s.do("cancel the batch", chromedp.Click(chromedp.CSS("#batch-cancel")), 5*time.Second)
	s.wait("batch cancelled", `document.getElementById('batch-box').dataset.done === 'true' && document.getElementById('batch-summary').textContent.includes('2 cancelled')`, 30*time.Second)
}

// TestPageKeyframes adds a keyframe on the page (the demo image for section 0), submits, and sees
// the job carry it: the keyframe's section and its image's hash in the spec, the live view's
// settings naming it; the job runs to its video.
func TestPageKeyframes(t *testing.T) {
	s := openPage(t, httpapitest.Options{})
	img, err := httpapitest.DemoImage()
	if err != nil {
		t.Fatal(err)
	}
	s.upload("#image", img)
	s.js("fill the form", tinyJob)
	s.js("add a keyframe", `(() => { document.getElementById('keyframes-box').open = true; document.getElementById('keyframe-add').click(); })()`)
	s.upload("#keyframes .keyframe .kf-image", img)
	s.do("submit", chromedp.Click(chromedp.CSS("#submit")), 5*time.Second)
	s.wait("job listed", `document.getElementById('live-id').textContent !== ''`, 20*time.Second)
	s.wait("settings name the keyframe", `document.getElementById('settings').textContent.includes('section 0')`, 10*time.Second)
	ks := s.job().GetSpec().GetKeyframes()
	if len(ks) != 1 || ks[0].GetSection() != 0 || len(ks[0].GetImageSha256()) != 64 {
		t.Fatalf("the page's keyframes: %v", ks)
	}
	s.wait("finished", `document.getElementById('live-state').dataset.state === 'SUCCEEDED'`, 3*time.Minute)
}

// TestPageVideo extends a short video from the page: no start image, the video uploaded, the
// context frames and the output setting in the spec, and the job runs to a video that starts with
// the input's frames.
func TestPageVideo(t *testing.T) {
	if _, err := exec.LookPath("ffprobe"); err != nil {
		t.Skip("no ffprobe (make setup installs ffmpeg)")
	}
	vid := filepath.Join(t.TempDir(), "in.mp4")
	if out, err := exec.Command("ffmpeg", "-v", "error", "-f", "lavfi", "-i", "testsrc=size=96x64:rate=30", "-frames:v", "12",
		"-pix_fmt", "yuv420p", vid).CombinedOutput(); err != nil {
		t.Fatalf("make a test video: %v %s", err, out)
	}
	s := openPage(t, httpapitest.Options{})
	s.js("fill the form", tinyJob)
	s.js("open the video box", `document.getElementById('video-box').open = true`)
	s.upload("#input-video", vid)
	s.js("set the video's settings", `(() => { document.getElementById('video-context').value = '3'; document.getElementById('input-video').dispatchEvent(new Event('change')); })()`)
	s.do("submit", chromedp.Click(chromedp.CSS("#submit")), 5*time.Second)
	s.wait("job listed", `document.getElementById('live-id').textContent !== ''`, 20*time.Second)
	s.wait("settings name the video", `document.getElementById('settings').textContent.includes('extends video')`, 10*time.Second)
	spec := s.job().GetSpec()
	if len(spec.GetInputVideoSha256()) != 64 || spec.GetVideoContextFrames() != 3 || !spec.GetVideoIncludeInput() {
		t.Fatalf("the page's video job: %v", spec)
	}
	s.wait("finished", `document.getElementById('live-state').dataset.state === 'SUCCEEDED'`, 3*time.Minute)
	if n := s.job().GetResult().GetFrameCount(); n <= 12 {
		t.Errorf("%d frames: want the 12 input frames and the new ones", n)
	}
}
