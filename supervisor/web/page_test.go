package web_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/framepackd/framepackd/internal/workerkit/workertest"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/httpapi/httpapitest"
	"github.com/framepackd/framepackd/supervisor/web"
)

func TestMain(m *testing.M) { os.Exit(workertest.Main(m)) }

// browser finds Debian's chromium (make setup installs it).
func browser(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium on PATH: make setup installs Debian's chromium package, which this test drives")
	return ""
}

func TestPageHeaders(t *testing.T) {
	d := httptest.NewServer(web.Handler())
	defer d.Close()
	for _, path := range []string{"/", "/app.js", "/style.css"} {
		resp, err := http.Get(d.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Security-Policy") != web.CSP {
			t.Errorf("%s: %d, CSP %q", path, resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
		}
	}
	resp, err := http.Post(d.URL+"/", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %d", resp.StatusCode)
	}
}

// TestPageInBrowser drives the page in headless chromium against a real daemon (real workers,
// tiny models): it uploads the demo image, sets the tiny job's settings, submits, sees step
// progress and a latent preview image (the demo image is its end frame too, at strength 0.5), the video of the first section and then the finished
// MP4 loaded in the <video> (readyState >= 2, the expected duration), then submits a second
// job and cancels it from the queue. Any console error (a CSP violation included) fails it.
func TestPageInBrowser(t *testing.T) {
	exe := browser(t)
	d := httpapitest.Start(t, httpapitest.Options{Page: web.Handler()})
	img, err := httpapitest.DemoImage()
	if err != nil {
		t.Fatal(err)
	}

	actx, cancelA := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("autoplay-policy", "no-user-gesture-required"))...)
	defer cancelA()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	var mu sync.Mutex
	var problems []string
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == "error" || strings.Contains(m.Text, "Content Security Policy") {
				mu.Lock()
				problems = append(problems, m.String())
				mu.Unlock()
			}
		}
	}()
	step := func(what string, a chromedp.Action[chromedp.Void], timeout time.Duration) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if _, err := chromedp.Run(sctx, a); err != nil {
			var state string
			_, _ = chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`0`)) // keep the session
			state, _ = chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById('progress-text').textContent + ' | ' + document.getElementById('failure').textContent + ' | ' + document.getElementById('submit-error').textContent`))
			t.Fatalf("%s: %v (page: %s)", what, err, state)
		}
	}
	// poll evaluates expr until it is true; an evaluation error (the page between two
	// documents) is retried like false.
	poll := func(what, expr string, timeout time.Duration) {
		t.Helper()
		step(what, func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
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
	// Two sections (1 s at window 3) of 2 steps at the tiny models' 96 px buckets.
	fill := `(() => {
		const set = (id, v) => { document.getElementById(id).value = v; };
		set('seconds', '1'); set('steps', '2'); set('resolution', '96'); set('window', '3'); set('seed', '7');
		set('end-strength', '0.5');
		set('cache', 'none');
	})()`

	start := time.Now()
	step("open the page", chromedp.Navigate(d.URL+"/"), 20*time.Second)
	poll("queue loaded", `document.getElementById('conn').textContent === 'connected'`, 10*time.Second)
	step("upload the image", chromedp.SetUploadFiles(chromedp.CSS("#image"), []string{img}), 10*time.Second)
	poll("image preview", `(() => { const i = document.getElementById('image-preview'); return !i.hidden && i.complete && i.naturalWidth > 0; })()`, 10*time.Second)
	// The same picture as the end frame, at half strength (FramePack-Studio's end frame).
	step("upload the end image", chromedp.SetUploadFiles(chromedp.CSS("#end-image"), []string{img}), 10*time.Second)
	poll("end image preview", `(() => { const i = document.getElementById('end-image-preview'); return !i.hidden && i.complete && i.naturalWidth > 0; })()`, 10*time.Second)
	step("fill the form", chromedp.Evaluate[chromedp.Void](fill), 5*time.Second)
	step("submit", chromedp.Click(chromedp.CSS("#submit")), 5*time.Second)
	poll("step progress", `document.getElementById('progress-text').dataset.step !== undefined`, 90*time.Second)
	poll("latent preview", `(() => { const i = document.getElementById('preview'); return !i.hidden && i.complete && i.naturalWidth > 0; })()`, 30*time.Second)
	poll("the first section's video", `document.getElementById('video').src.includes('/sections/')`, 60*time.Second)
	poll("the finished video", `(() => { const v = document.getElementById('video'); return v.dataset.final === 'true' && v.readyState >= 2; })()`, 90*time.Second)
	id, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById('live-id').textContent`))
	if err != nil {
		t.Fatal(err)
	}
	job, err := d.Jobs.GetJob(t.Context(), &framepackv1.GetJobRequest{JobId: id})
	if err != nil {
		t.Fatalf("job %q from the page: %v", id, err)
	}
	if job.GetJob().GetState() != framepackv1.JobState_JOB_STATE_SUCCEEDED || job.GetJob().GetSpec().GetSteps() != 2 ||
		job.GetJob().GetSpec().GetResolution() != 96 || job.GetJob().GetSpec().GetUseTeacache() || job.GetJob().GetSpec().GetSeed() != 7 ||
		job.GetJob().GetSpec().GetEndStrength() != 0.5 || len(job.GetJob().GetSpec().GetEndImageSha256()) != 64 {
		t.Fatalf("the page's job: %v", job.GetJob())
	}
	dur, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`document.getElementById('video').duration`))
	if err != nil {
		t.Fatal(err)
	}
	if want := float64(job.GetJob().GetResult().GetFrameCount()) / 30; math.Abs(dur-want) > 0.1 {
		t.Errorf("<video> duration %.3f s, want %.3f s (%d frames)", dur, want, job.GetJob().GetResult().GetFrameCount())
	}
	poll("state badge", `document.getElementById('live-state').dataset.state === 'SUCCEEDED'`, 10*time.Second)
	poll("settings shown", `document.getElementById('settings').textContent.includes('seed7')`, 5*time.Second)
	t.Logf("first job %s done in %s, video %.3f s", id, time.Since(start).Round(time.Millisecond), dur)

	// A second job, cancelled from the queue: long enough (10 sections of 20 steps) that it is
	// still running when the cancel lands, however loaded the machine is.
	step("lengthen the job", chromedp.Evaluate[chromedp.Void](`(() => {
		document.getElementById('seconds').value = '4'; document.getElementById('steps').value = '20';
	})()`), 5*time.Second)
	step("submit again", chromedp.Click(chromedp.CSS("#submit")), 5*time.Second)
	poll("second job listed", fmt.Sprintf(`(() => { const id = document.getElementById('live-id').textContent; return id !== %q && document.querySelector('#jobs tr[data-id="' + id + '"] button.cancel') !== null; })()`, id), 20*time.Second)
	second, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById('live-id').textContent`))
	if err != nil {
		t.Fatal(err)
	}
	step("cancel", chromedp.Click(chromedp.CSS(fmt.Sprintf(`#jobs tr[data-id=%q] button.cancel`, second))), 10*time.Second)
	poll("cancelled in the queue", fmt.Sprintf(`document.querySelector('#jobs tr[data-id=%q]').dataset.state === 'CANCELLED'`, second), 30*time.Second)
	poll("cancelled in the live view", `document.getElementById('live-state').dataset.state === 'CANCELLED'`, 10*time.Second)
	if got, err := d.Jobs.GetJob(t.Context(), &framepackv1.GetJobRequest{JobId: second}); err != nil || got.GetJob().GetState() != framepackv1.JobState_JOB_STATE_CANCELLED {
		t.Errorf("second job %s: %v %v", second, got.GetJob().GetState(), err)
	}
	poll("devices panel", `document.querySelector('#devices .device[data-lane="cpu"][data-state="HEALTHY"]') !== null`, 20*time.Second)
	t.Logf("browser test took %s", time.Since(start).Round(time.Millisecond))

	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Errorf("console: %s", p)
	}
}

// TestPageSignIn serves the page with a bearer token required: the page asks for it, signs in
// (the session cookie) and then lists the devices and the queue.
func TestPageSignIn(t *testing.T) {
	exe := browser(t)
	const token = "page-token-0123456789"
	d := httpapitest.Start(t, httpapitest.Options{Page: web.Handler(), Token: token})
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU)...)
	defer cancelA()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	tctx, cancelT := context.WithTimeout(ctx, 60*time.Second)
	defer cancelT()
	wait := func(what, expr string) {
		t.Helper()
		for {
			ok, err := chromedp.Run(tctx, chromedp.Evaluate[bool](expr))
			if err == nil && ok {
				return
			}
			select {
			case <-tctx.Done():
				t.Fatalf("%s: %v", what, err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	if _, err := chromedp.Run(tctx, chromedp.Navigate(d.URL+"/")); err != nil {
		t.Fatal(err)
	}
	wait("sign-in shown", `!document.getElementById('auth').hidden`)
	if _, err := chromedp.Run(tctx, chromedp.Evaluate[chromedp.Void](`document.getElementById('token').value = 'wrong-wrong-wrong-wrong'`)); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(tctx, chromedp.Click(chromedp.CSS(`#auth-form button`))); err != nil {
		t.Fatal(err)
	}
	wait("wrong token refused", `document.getElementById('auth-error').textContent.includes('token')`)
	if _, err := chromedp.Run(tctx, chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.getElementById('token').value = %q`, token))); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(tctx, chromedp.Click(chromedp.CSS(`#auth-form button`))); err != nil {
		t.Fatal(err)
	}
	wait("signed in", `document.getElementById('auth').hidden && document.getElementById('conn').textContent === 'connected'`)
	wait("devices listed", `document.querySelector('#devices .device[data-lane="cpu"]') !== null`)
	// The cookie is HttpOnly: the page's script cannot read it.
	if c, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.cookie`)); err != nil || strings.Contains(c, token) {
		t.Errorf("document.cookie %q %v", c, err)
	}
}
