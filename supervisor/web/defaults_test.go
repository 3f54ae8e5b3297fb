package web_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/framepackd/framepackd/supervisor/httpapi/httpapitest"
	"github.com/framepackd/framepackd/supervisor/web"
)

// pageAt opens d's page in headless chromium and returns a function that waits (up to a
// minute in all) until expr is true in it.
func pageAt(t *testing.T, d *httpapitest.Daemon) (waitFor func(what, expr string)) {
	t.Helper()
	exe := browser(t)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU)...)
	t.Cleanup(cancelA)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	tctx, cancelT := context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(cancelT)
	if _, err := chromedp.Run(tctx, chromedp.Navigate(d.URL+"/")); err != nil {
		t.Fatal(err)
	}
	return func(what, expr string) {
		t.Helper()
		for {
			ok, err := chromedp.Run(tctx, chromedp.Evaluate[bool](expr))
			if err == nil && ok {
				return
			}
			select {
			case <-tctx.Done():
				body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerHTML`))
				t.Fatalf("%s: %v\n%.2000s", what, err, body)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// TestPageResolutionFollowsModels is issue 32's page item: the resolution the form sends by
// default is the served models' (96 on the tiny test models: the page's "640 (FramePack)"
// default ran them for many minutes on a CPU), and the table they refuse cannot be chosen.
func TestPageResolutionFollowsModels(t *testing.T) {
	waitFor := pageAt(t, httpapitest.Start(t, httpapitest.Options{Page: web.Handler()}))
	waitFor("the resolution select follows the tiny models", `(() => {
		const sel = document.getElementById('resolution');
		const at640 = sel.querySelector('option[value="640"]');
		return sel.value === '96' && at640.disabled && at640.title.includes('not FramePack');
	})()`)
}

// TestPageDevicesNotServing: while the server cannot run jobs, the devices panel shows its
// lane not serving, with the reason (it showed "healthy").
func TestPageDevicesNotServing(t *testing.T) {
	const why = "no variant can run: framepack: model files missing"
	d := httpapitest.Start(t, httpapitest.Options{Page: web.Handler(), Ready: func() error { return errors.New(why) }})
	waitFor := pageAt(t, d)
	waitFor("the lane not serving, with the reason", `(() => {
		const dev = document.querySelector('#devices .device[data-lane="cpu"]');
		return dev !== null && dev.dataset.state === 'NOT_SERVING' && dev.textContent.includes('not_serving') &&
			dev.textContent.includes('`+why+`');
	})()`)
}
