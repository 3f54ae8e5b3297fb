package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/hfhub"
	"github.com/framepackd/framepackd/internal/hfhub/hubtest"
	"github.com/framepackd/framepackd/internal/parity"
)

// TestPullMissing: --pull-missing fills an empty --models from the (fake) hub before serving,
// finds it complete the next time, and refuses to start when the hub refuses.
func TestPullMissing(t *testing.T) {
	root, err := parity.Root()
	if err != nil {
		t.Fatal(err)
	}
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	commits, err := hub.PushFixtures(filepath.Join(root, "models"))
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t)
	for _, k := range []string{"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"} {
		t.Setenv(k, "")
	}
	t.Setenv("HF_ENDPOINT", hub.Endpoint())
	t.Setenv("HF_HOME", filepath.Join(f.dir, "hfhome"))

	cmd, logs, _ := f.start(t, "--pull-missing")
	for _, want := range []string{`"msg":"pulling missing models"`, `"msg":"models pulled"`, `"msg":"models found"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %s:\n%s", want, logs.String())
		}
	}
	models := filepath.Join(f.dir, "models")
	cache := hfhub.Cache{Root: models}
	for _, repo := range []string{"hunyuanvideo-community/HunyuanVideo", "lllyasviel/flux_redux_bfl", "lllyasviel/FramePackI2V_HY"} {
		if c, ok := cache.Ref(repo, "main"); !ok || c != commits[repo] {
			t.Errorf("%s refs/main %q, want %s", repo, c, commits[repo])
		}
	}
	if _, err := os.Stat(cache.RepoDir("lllyasviel/FramePack_F1_I2V_HY_20250503")); !os.IsNotExist(err) {
		t.Errorf("F1 pulled without --pull-variants f1: %v", err)
	}
	stop(t, cmd, logs)

	// Complete now: nothing is downloaded.
	before := len(hub.Requests())
	cmd, logs, _ = f.start(t, "--pull-missing")
	if !strings.Contains(logs.String(), `"msg":"models complete; nothing to pull"`) || len(hub.Requests()) != before {
		t.Errorf("second start asked the hub %d times:\n%s", len(hub.Requests())-before, logs.String())
	}
	stop(t, cmd, logs)

	// F1 from a gated repository without a token: the daemon does not start, and says why.
	hub.SetGated("lllyasviel/FramePack_F1_I2V_HY_20250503", true)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, f.bin, f.args("--pull-missing", "--pull-variants", "i2v,f1")...).CombinedOutput()
	if code := exitCode(err); code != 1 || !strings.Contains(string(out), "HF_TOKEN") || !strings.Contains(string(out), "FramePack_F1_I2V_HY_20250503") {
		t.Fatalf("gated pull at start: exit %d\n%s", code, out)
	}
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
