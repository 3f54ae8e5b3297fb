package web_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/parity"
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

// browserPage is a headless chromium tab for one test, with helpers that fail the test with
// the page's visible state.
type browserPage struct {
	t   *testing.T
	ctx context.Context
	mu  sync.Mutex
	// problems are console errors and exceptions (a CSP violation included).
	problems []string
}

// openBrowser starts chromium for t (stopped when t ends) and collects console problems.
func openBrowser(t *testing.T) *browserPage {
	t.Helper()
	exe := browser(t)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("autoplay-policy", "no-user-gesture-required"))...)
	t.Cleanup(cancelA)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if _, err := chromedp.Run(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	p := &browserPage{t: t, ctx: ctx}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == "error" || strings.Contains(m.Text, "Content Security Policy") {
				p.mu.Lock()
				p.problems = append(p.problems, m.String())
				p.mu.Unlock()
			}
		}
	}()
	return p
}

// consoleProblems fails the test for every console error and exception seen, except those
// containing one of expected (the browser's note of an error answer the test provoked).
func (p *browserPage) consoleProblems(expected ...string) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
next:
	for _, m := range p.problems {
		for _, e := range expected {
			if strings.Contains(m, e) {
				continue next
			}
		}
		p.t.Errorf("console: %s", m)
	}
}

// step runs a, failing the test with the page's progress and error texts.
func (p *browserPage) step(what string, a chromedp.Action[chromedp.Void], timeout time.Duration) {
	p.t.Helper()
	sctx, cancel := context.WithTimeout(p.ctx, timeout)
	defer cancel()
	if _, err := chromedp.Run(sctx, a); err != nil {
		state, _ := chromedp.Run(p.ctx, chromedp.Evaluate[string](`[...['progress-text', 'failure', 'submit-error']].map((id) => document.getElementById(id).textContent).join(' | ') +
			' | invalid: ' + [...document.querySelectorAll('#job-form :invalid')].map((e) => e.id + ' ' + e.validationMessage).join(', ')`))
		p.t.Fatalf("%s: %v (page: %s)", what, err, state)
	}
}

// js runs a script.
func (p *browserPage) js(what, script string) {
	p.t.Helper()
	p.step(what, chromedp.Evaluate[chromedp.Void](script), 10*time.Second)
}

// poll evaluates expr until it is true; an evaluation error (the page between two
// documents) is retried like false.
func (p *browserPage) poll(what, expr string, timeout time.Duration) {
	p.t.Helper()
	p.step(what, func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
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

// text evaluates a string expression.
func (p *browserPage) text(expr string) string {
	p.t.Helper()
	s, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		p.t.Fatalf("%s: %v", expr, err)
	}
	return s
}

// TestPageInBrowser drives the page in headless chromium against a real daemon (real workers,
// tiny models). With nothing selected the job panel shows no empty badge. It uploads the demo
// image (also as the end frame, at strength 0.5), sets the tiny job's settings and a LoRA,
// submits, and sees step progress, the VAE decode's progress, a latent preview image, the
// devices panel naming the running job (and no longer once it ended), the video of the first
// section and then the finished MP4 in the <video> (readyState >= 2, the expected duration);
// the job's Settings list every setting (variant, end strength, the LoRA with what it
// changed). The gallery shows the finished video's thumbnail and prompt; "use these settings"
// fills the form with its settings and images, and the job submitted from it has the same
// spec and start image. That job is cancelled from the job panel, deleted from the queue, and
// the first deleted from the job panel: both are gone from the server, the queue and the
// gallery. Any console error (a CSP violation included) fails it.
func TestPageInBrowser(t *testing.T) {
	d := httpapitest.Start(t, httpapitest.Options{Page: web.Handler()})
	img, err := httpapitest.DemoImage()
	if err != nil {
		t.Fatal(err)
	}
	root, err := parity.Root()
	if err != nil {
		t.Fatal(err)
	}
	lora := filepath.Join(root, "models", "loras", "style_peft.safetensors")
	p := openBrowser(t)

	// Two sections (1 s at window 3) of 2 steps at the tiny models' 96 px buckets, a LoRA.
	fill := fmt.Sprintf(`(() => {
		const set = (id, v) => { document.getElementById(id).value = v; };
		set('seconds', '1'); set('steps', '2'); set('resolution', '96'); set('window', '3'); set('seed', '7');
		set('end-strength', '0.5'); set('loras', %q);
		document.getElementById('cache').value = 'none';
	})()`, lora+" 0.7")

	start := time.Now()
	p.step("open the page", chromedp.Navigate(d.URL+"/"), 20*time.Second)
	p.poll("queue loaded", `document.getElementById('conn').textContent === 'connected'`, 10*time.Second)
	if shown := p.text(`(() => { const b = document.getElementById('live-state'); return getComputedStyle(b).display + ' ' + b.getBoundingClientRect().width; })()`); shown != "none 0" {
		t.Errorf("the job panel shows a state badge with no job: %s", shown)
	}
	p.step("upload the image", chromedp.SetUploadFiles(chromedp.CSS("#image"), []string{img}), 10*time.Second)
	p.poll("image preview", `(() => { const i = document.getElementById('image-preview'); return !i.hidden && i.complete && i.naturalWidth > 0; })()`, 10*time.Second)
	// The same picture as the end frame, at half strength (FramePack-Studio's end frame).
	p.step("upload the end image", chromedp.SetUploadFiles(chromedp.CSS("#end-image"), []string{img}), 10*time.Second)
	p.poll("end image preview", `(() => { const i = document.getElementById('end-image-preview'); return !i.hidden && i.complete && i.naturalWidth > 0; })()`, 10*time.Second)
	p.js("fill the form", fill)
	p.step("submit", chromedp.Click(chromedp.CSS("#submit")), 5*time.Second)
	p.poll("step progress", `document.getElementById('progress-text').dataset.step !== undefined`, 90*time.Second)
	id := p.text(`document.getElementById('live-id').textContent`)
	p.poll("the devices panel names the running job", fmt.Sprintf(`document.querySelector('#devices .device[data-lane="cpu"] .running[data-job=%q]') !== null`, id), 10*time.Second)
	p.poll("latent preview", `(() => { const i = document.getElementById('preview'); return !i.hidden && i.complete && i.naturalWidth > 0; })()`, 30*time.Second)
	p.poll("decode progress", `/^[1-9][0-9]*\/[1-9][0-9]*$/.test(document.getElementById('progress-text').dataset.decode || '')`, 60*time.Second)
	p.poll("the first section's video", `document.getElementById('video').src.includes('/sections/')`, 60*time.Second)
	p.poll("the finished video", `(() => { const v = document.getElementById('video'); return v.dataset.final === 'true' && v.readyState >= 2; })()`, 90*time.Second)
	p.poll("the devices panel no longer names it", `document.querySelector('#devices .device .running') === null`, 4*time.Second)
	job, err := d.Jobs.GetJob(t.Context(), &framepackv1.GetJobRequest{JobId: id})
	if err != nil {
		t.Fatalf("job %q from the page: %v", id, err)
	}
	spec := job.GetJob().GetSpec()
	if job.GetJob().GetState() != framepackv1.JobState_JOB_STATE_SUCCEEDED || spec.GetSteps() != 2 || spec.GetResolution() != 96 ||
		spec.GetUseTeacache() || spec.GetSeed() != 7 || spec.GetEndStrength() != 0.5 || len(spec.GetEndImageSha256()) != 64 ||
		len(spec.GetLoras()) != 1 || spec.GetLoras()[0].GetStrength() != 0.7 {
		t.Fatalf("the page's job: %v", job.GetJob())
	}
	dur, err := chromedp.Run(p.ctx, chromedp.Evaluate[float64](`document.getElementById('video').duration`))
	if err != nil {
		t.Fatal(err)
	}
	if want := float64(job.GetJob().GetResult().GetFrameCount()) / 30; math.Abs(dur-want) > 0.1 {
		t.Errorf("<video> duration %.3f s, want %.3f s (%d frames)", dur, want, job.GetJob().GetResult().GetFrameCount())
	}
	p.poll("state badge", `document.getElementById('live-state').dataset.state === 'SUCCEEDED'`, 10*time.Second)
	p.poll("settings shown", `document.getElementById('settings').textContent.includes('seed7')`, 5*time.Second)
	settings := p.text(`[...document.querySelectorAll('#settings dd')].map((dd) => dd.dataset.setting + '=' + dd.textContent).join('\n')`)
	applied := job.GetJob().GetLorasApplied()
	if len(applied) != 1 {
		t.Fatalf("loras applied %v", applied)
	}
	for _, want := range []string{"variant=i2v", "end strength=0.5", "end image=sha256 " + spec.GetEndImageSha256()[:16],
		fmt.Sprintf("LoRAs=%s × 0.7 (%s, %d weights changed)", lora, applied[0].GetFormat(), applied[0].GetWeightsChanged()),
		"latent window=3", "resolution=96", "TeaCache=off", "MP4 CRF=16", "GPU memory kept free=6 GB"} {
		if !strings.Contains(settings, want) {
			t.Errorf("settings lack %q:\n%s", want, settings)
		}
	}
	t.Logf("first job %s done in %s, video %.3f s", id, time.Since(start).Round(time.Millisecond), dur)

	// The gallery: the video's thumbnail (not the start image's fallback) and its prompt.
	card := fmt.Sprintf(`#gallery-items .card[data-id=%q]`, id)
	p.poll("gallery thumbnail", fmt.Sprintf(`(() => { const i = document.querySelector('%s img.thumb'); return i !== null && i.complete && i.naturalWidth > 0 && !i.dataset.fallback; })()`, card), 20*time.Second)
	if got := p.text(fmt.Sprintf(`document.querySelector('%s .card-prompt').textContent`, card)); got != spec.GetPrompt() {
		t.Errorf("gallery prompt %q, want %q", got, spec.GetPrompt())
	}
	// Use these settings: a form changed since, then filled from the card.
	p.js("change the form", `(() => {
		const set = (id, v) => { document.getElementById(id).value = v; };
		set('seed', '99'); set('steps', '9'); set('loras', ''); set('end-strength', '1'); set('resolution', '640');
		document.getElementById('cache').value = 'teacache';
		document.getElementById('image').value = ''; document.getElementById('end-image').value = '';
	})()`)
	p.js("use these settings", fmt.Sprintf(`document.querySelector('%s button.reuse').click()`, card))
	p.poll("form filled", fmt.Sprintf(`document.getElementById('job-form').dataset.reusedFrom === %q`, id), 10*time.Second)
	form := p.text(`['seed', 'steps', 'resolution', 'window', 'seconds', 'end-strength', 'loras', 'prompt'].map((id) => document.getElementById(id).value).join('|') +
		'|' + document.getElementById('cache').value + '|' + document.getElementById('image').files.length + '|' + document.getElementById('end-image').files.length`)
	if want := fmt.Sprintf("7|2|96|3|1|0.5|%s 0.7|%s|none|1|1", lora, spec.GetPrompt()); form != want {
		t.Errorf("form after use these settings\n got %s\nwant %s", form, want)
	}
	// Submitted as it is, longer (10 sections of 20 steps), so that it still runs when the job
	// panel cancels it.
	p.js("lengthen the job", `document.getElementById('seconds').value = '4'; document.getElementById('steps').value = '20';`)
	// A script's click: "use these settings" scrolls the form into view smoothly, and a click
	// at coordinates could land while the page still moves.
	p.js("submit again", `document.getElementById('submit').click()`)
	p.poll("second job selected", fmt.Sprintf(`(() => { const id = document.getElementById('live-id').textContent; return id !== '' && id !== %q && !document.getElementById('live-cancel').hidden; })()`, id), 20*time.Second)
	second := p.text(`document.getElementById('live-id').textContent`)
	checkSameJob(t, d, id, second)
	p.js("cancel from the job panel", `document.getElementById('live-cancel').click()`)
	p.poll("cancelled in the live view", `document.getElementById('live-state').dataset.state === 'CANCELLED'`, 30*time.Second)
	p.poll("cancelled in the queue", fmt.Sprintf(`document.querySelector('#jobs tr[data-id=%q]').dataset.state === 'CANCELLED'`, second), 10*time.Second)
	if got, err := d.Jobs.GetJob(t.Context(), &framepackv1.GetJobRequest{JobId: second}); err != nil || got.GetJob().GetState() != framepackv1.JobState_JOB_STATE_CANCELLED {
		t.Errorf("second job %s: %v %v", second, got.GetJob().GetState(), err)
	}

	// Delete: the cancelled job from the queue, the finished one from the job panel.
	p.js("confirm without asking", `window.confirm = () => true`)
	p.poll("delete button in the queue", fmt.Sprintf(`document.querySelector('#jobs tr[data-id=%q] button.delete') !== null`, second), 10*time.Second)
	p.js("delete from the queue", fmt.Sprintf(`document.querySelector('#jobs tr[data-id=%q] button.delete').click()`, second))
	p.poll("gone from the queue", fmt.Sprintf(`document.querySelector('#jobs tr[data-id=%q]') === null`, second), 10*time.Second)
	p.js("open the first job", fmt.Sprintf(`document.querySelector('#jobs tr[data-id=%q]').click()`, id))
	p.poll("delete button in the job panel", `!document.getElementById('live-delete').hidden`, 10*time.Second)
	p.js("delete from the job panel", `document.getElementById('live-delete').click()`)
	p.poll("gone from the page", fmt.Sprintf(`document.querySelector('#jobs tr[data-id=%q]') === null && document.querySelector('%s') === null &&
		document.getElementById('live-body').hidden && getComputedStyle(document.getElementById('live-state')).display === 'none'`, id, card), 10*time.Second)
	for _, j := range []string{id, second} {
		if _, err := d.Jobs.GetJob(t.Context(), &framepackv1.GetJobRequest{JobId: j}); status.Code(err) != codes.NotFound {
			t.Errorf("job %s after delete: %v", j, err)
		}
	}
	p.poll("devices panel", `document.querySelector('#devices .device[data-lane="cpu"][data-state="HEALTHY"]') !== null`, 20*time.Second)
	t.Logf("browser test took %s", time.Since(start).Round(time.Millisecond))
	p.consoleProblems()
}

// checkSameJob checks that job b, submitted with "use these settings" from job a (then made
// 4 s long at 20 steps), has a's spec otherwise and a's start and end images.
func checkSameJob(t *testing.T, d *httpapitest.Daemon, a, b string) {
	t.Helper()
	get := func(id string) *framepackv1.Job {
		r, err := d.Jobs.GetJob(t.Context(), &framepackv1.GetJobRequest{JobId: id})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetJob()
	}
	sa, sb := get(a).GetSpec(), get(b).GetSpec()
	want := proto.Clone(sa).(*framepackv1.JobSpec)
	want.TotalSecondLength, want.Steps = 4, 20
	if !proto.Equal(want, sb) {
		t.Errorf("job from use these settings\n got %v\nwant %v", sb, want)
	}
	for _, kind := range []framepackv1.ArtifactKind{framepackv1.ArtifactKind_ARTIFACT_KIND_IMAGE, framepackv1.ArtifactKind_ARTIFACT_KIND_END_IMAGE} {
		fa, fb := artifact(t, d, a, kind), artifact(t, d, b, kind)
		if len(fa) == 0 || !bytes.Equal(fa, fb) {
			t.Errorf("%v: %d bytes, the first job's %d", kind, len(fb), len(fa))
		}
	}
}

// artifact downloads a job's file through GetArtifact.
func artifact(t *testing.T, d *httpapitest.Daemon, id string, kind framepackv1.ArtifactKind) []byte {
	t.Helper()
	stream, err := d.Jobs.GetArtifact(t.Context(), &framepackv1.GetArtifactRequest{JobId: id, Kind: kind})
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for {
		c, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s %v: %v", id, kind, err)
		}
		out = append(out, c.GetData()...)
	}
}

// TestPageFieldErrors: the server's validation errors appear next to their fields (a LoRA
// path that does not exist, a timed prompt never closed), the "More" box opening to show
// them, and a long unbroken error wraps inside its card.
func TestPageFieldErrors(t *testing.T) {
	d := httpapitest.Start(t, httpapitest.Options{Page: web.Handler()})
	img, err := httpapitest.DemoImage()
	if err != nil {
		t.Fatal(err)
	}
	p := openBrowser(t)
	p.step("open the page", chromedp.Navigate(d.URL+"/"), 20*time.Second)
	p.poll("queue loaded", `document.getElementById('conn').textContent === 'connected'`, 10*time.Second)
	p.step("upload the image", chromedp.SetUploadFiles(chromedp.CSS("#image"), []string{img}), 10*time.Second)
	missing := "/no/such/folder/" + strings.Repeat("a_very_long_lora_name_", 20) + ".safetensors"
	p.js("fill the form", fmt.Sprintf(`(() => {
		document.getElementById('loras').value = %q;
		document.getElementById('prompt').value = '[0s: a cat sits';
		document.getElementById('resolution').value = '96';
	})()`, missing+" 0.5"))
	p.step("submit", chromedp.Click(chromedp.CSS("#submit")), 5*time.Second)
	p.poll("errors at the fields", `document.querySelector('.field-error[data-error-for="loras"]') !== null && document.querySelector('.field-error[data-error-for="prompt"]') !== null`, 20*time.Second)
	lorasErr := p.text(`document.querySelector('.field-error[data-error-for="loras"]').textContent`)
	promptErr := p.text(`document.querySelector('.field-error[data-error-for="prompt"]').textContent`)
	if !strings.Contains(lorasErr, "not a readable safetensors file") || !strings.Contains(promptErr, "never closed") {
		t.Errorf("field errors: loras %q, prompt %q", lorasErr, promptErr)
	}
	if got := p.text(`document.getElementById('submit-error').textContent`); !strings.Contains(got, "fields marked") {
		t.Errorf("submit error %q", got)
	}
	// The LoRA error (a path of 450 characters without a space) stays inside the form's card,
	// which the "More" box opened to show it.
	fits := p.text(`(() => {
		const e = document.querySelector('.field-error[data-error-for="loras"]'), card = document.getElementById('new');
		const r = e.getBoundingClientRect(), c = card.getBoundingClientRect();
		return [e.closest('details').open, r.width > 0, r.right <= c.right + 0.5, card.scrollWidth <= card.clientWidth].join(' ');
	})()`)
	if fits != "true true true true" {
		t.Errorf("the LoRA error does not wrap inside the card (details open, shown, inside, no overflow): %s", fits)
	}
	// Editing a field clears its error.
	p.js("edit the prompt", `(() => { const e = document.getElementById('prompt'); e.value = 'a cat'; e.dispatchEvent(new Event('input', { bubbles: true })); })()`)
	p.poll("prompt error cleared", `document.querySelector('.field-error[data-error-for="prompt"]') === null`, 5*time.Second)
	jobs, err := d.Jobs.ListJobs(t.Context(), &framepackv1.ListJobsRequest{})
	if err != nil || len(jobs.GetJobs()) != 0 {
		t.Errorf("jobs after refused submits: %v %v", jobs.GetJobs(), err)
	}
	p.consoleProblems("the server responded with a status of 400")
}

// TestPageDevicesLive: with the daemon down, the devices panel says the lane is unreachable
// within seconds instead of showing it healthy.
func TestPageDevicesLive(t *testing.T) {
	d := httpapitest.Start(t, httpapitest.Options{Page: web.Handler()})
	p := openBrowser(t)
	p.step("open the page", chromedp.Navigate(d.URL+"/"), 20*time.Second)
	p.poll("devices listed", `document.querySelector('#devices .device[data-lane="cpu"][data-state="HEALTHY"]') !== null`, 10*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := d.Daemon.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	p.poll("lane unreachable", `(() => {
		const dev = document.querySelector('#devices .device[data-lane="cpu"]');
		return dev.dataset.state === 'UNREACHABLE' && dev.querySelector('.state').textContent === 'unreachable' &&
			dev.textContent.includes('the daemon did not answer');
	})()`, 8*time.Second)
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
