package web_test

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/framepackd/framepackd/supervisor/httpapi/httpapitest"
	"github.com/framepackd/framepackd/supervisor/web"
)

// TestPageResolutionFollowsModels is issue 32's page item: the resolution the form sends by
// default is the served models' (96 on the tiny test models: the page's "640 (FramePack)"
// default ran them for many minutes on a CPU), and the table they refuse cannot be chosen.
func TestPageResolutionFollowsModels(t *testing.T) {
	exe := browser(t)
	d := httpapitest.Start(t, httpapitest.Options{Page: web.Handler()})
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU)...)
	defer cancelA()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	tctx, cancelT := context.WithTimeout(ctx, 60*time.Second)
	defer cancelT()
	if _, err := chromedp.Run(tctx, chromedp.Navigate(d.URL+"/")); err != nil {
		t.Fatal(err)
	}
	const want = `(() => {
		const sel = document.getElementById('resolution');
		const at640 = sel.querySelector('option[value="640"]');
		return sel.value === '96' && at640.disabled && at640.title.includes('not FramePack');
	})()`
	for {
		ok, err := chromedp.Run(tctx, chromedp.Evaluate[bool](want))
		if err == nil && ok {
			return
		}
		select {
		case <-tctx.Done():
			state, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById('resolution').outerHTML`))
			t.Fatalf("resolution select never followed the tiny models: %v\n%s", err, state)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
