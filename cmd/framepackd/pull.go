package main

// --pull-missing: before serving, download the models the pipeline lacks from the Hugging Face
// hub into --models (internal/hfhub; --models is then a Hugging Face cache, or a HF_HOME such
// as FramePack's hf_download/ whose hub/ is used). HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE are
// read as huggingface_hub reads them.

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/hfhub"
	"github.com/framepackd/framepackd/supervisor/pipeline"
)

// pullOptions are the flags of pulling at start.
type pullOptions struct {
	missing  bool
	variants string
}

// addPullFlags registers the pull flags on fs.
func addPullFlags(fs *flag.FlagSet) *pullOptions {
	p := &pullOptions{}
	fs.BoolVar(&p.missing, "pull-missing", false, "before serving, download the models missing from --models from the Hugging Face hub (HF_ENDPOINT, HF_TOKEN)")
	fs.StringVar(&p.variants, "pull-variants", "i2v", "pipelines --pull-missing pulls, comma-separated: "+strings.Join(hfhub.VariantNames(), ", "))
	return p
}

// pullProgressEvery is how often a pull at start logs its progress.
const pullProgressEvery = 10 * time.Second

// pullMissing pulls what the variants lack when --pull-missing is set.
func pullMissing(ctx context.Context, o *options, log logrus.FieldLogger) error {
	if o.pull == nil || !o.pull.missing {
		return nil
	}
	var names []string
	for _, v := range strings.Split(o.pull.variants, ",") {
		if v = strings.TrimSpace(v); v != "" {
			names = append(names, v)
		}
	}
	wants, err := hfhub.Wants(names, "")
	if err != nil {
		return fmt.Errorf("--pull-variants: %w", err)
	}
	if err := os.MkdirAll(o.models, 0o755); err != nil {
		return fmt.Errorf("pull models: %w", err)
	}
	cache := hfhub.Cache{Root: hfhub.CacheRoot(o.models)}
	complete := hfhub.VariantComplete(cache.Status(""))
	missing := false
	for _, v := range names {
		missing = missing || !complete[v]
	}
	if !missing {
		log.WithFields(logrus.Fields{"models": cache.Root, "variants": names}).Info("models complete; nothing to pull")
		return nil
	}
	if m, err := pipeline.ResolveModels(o.models); err == nil && !strings.Contains(m.Transformer, string(os.PathSeparator)+"snapshots"+string(os.PathSeparator)) {
		log.WithField("models", o.models).Info("models found in a folder layout, not a Hugging Face cache; not pulling")
		return nil
	}
	env := hfhub.FromEnv()
	log = log.WithFields(logrus.Fields{"cache": cache.Root, "endpoint": env.Endpoint})
	var mu sync.Mutex
	var last time.Time
	p := &hfhub.Puller{Client: hfhub.NewClient(env), Cache: cache, Offline: env.Offline,
		Progress: func(pr hfhub.Progress) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case pr.State == hfhub.FileFailed:
				log.WithError(pr.Err).WithFields(logrus.Fields{"repo": pr.Repo, "file": pr.Path}).Warn("model file failed")
			case time.Since(last) >= pullProgressEvery:
				last = time.Now()
				log.WithFields(logrus.Fields{"done": hfhub.Bytes(pr.TotalDone), "total": hfhub.Bytes(pr.Total),
					"files": fmt.Sprintf("%d/%d", pr.FilesDone, pr.Files)}).Info("pulling models")
			}
		}}
	p.Client.UserAgent = "framepackd"
	log.WithField("variants", names).Info("pulling missing models")
	plan, err := p.Plan(ctx, wants)
	if err != nil {
		return fmt.Errorf("pull models: %w", err)
	}
	if err := p.Pull(ctx, plan); err != nil {
		return fmt.Errorf("pull models: %w", err)
	}
	log.WithFields(logrus.Fields{"bytes": hfhub.Bytes(plan.Total), "downloaded": hfhub.Bytes(plan.Need)}).Info("models pulled")
	return nil
}
