package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/modelrt"
	"github.com/framepackd/framepackd/internal/workerkit/tensorio"
	"github.com/framepackd/framepackd/workers/clipvision/siglip"
)

// worker is the clipvision worker. Load happens once, before any Run (workerkit enforces it).
type worker struct {
	base *modelrt.Base
	log  *logrus.Entry

	// mu protects rt and enc; Run holds it for the whole stage (Stats does not take it).
	mu  sync.Mutex
	rt  *runtime.Runtime
	enc *siglip.Encoder
}

var _ workerkit.Worker = (*worker)(nil)

func newWorker(k *workerkit.Kit) *worker {
	base := modelrt.New(k, modelrt.Config{Name: "clipvision", Conv: true})
	return &worker{base: base, log: base.Log}
}

// modelDirs finds the image encoder and feature extractor folders from LoadRequest.model_dir:
// either a FLUX Redux folder holding image_encoder/ and feature_extractor/, or the
// image_encoder folder itself, with preprocessor_config.json beside config.json or in
// ../feature_extractor.
func modelDirs(dir string) (enc, fe string, err error) {
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	switch {
	case dir == "":
		return "", "", workerkit.Errorf(workerkit.CodeInvalidArgument, "load: model_dir is required")
	case exists(filepath.Join(dir, "image_encoder", "config.json")):
		enc = filepath.Join(dir, "image_encoder")
	case exists(filepath.Join(dir, "config.json")):
		enc = dir
	default:
		return "", "", workerkit.Errorf(workerkit.CodeInvalidArgument,
			"load: %s holds neither image_encoder/config.json nor config.json", dir)
	}
	for _, cand := range []string{filepath.Join(dir, "feature_extractor"), enc, filepath.Join(filepath.Dir(enc), "feature_extractor")} {
		if exists(filepath.Join(cand, "preprocessor_config.json")) {
			return enc, cand, nil
		}
	}
	return "", "", workerkit.Errorf(workerkit.CodeInvalidArgument,
		"load: no feature_extractor/preprocessor_config.json for %s", dir)
}

// Traits declares the model's traits before a Load succeeds (workerkit.TraitsDeclarer).
func (w *worker) Traits() *workerkit.ModelTraits { return w.base.Traits() }

// Load opens the runtime of req.Backend and loads the encoder.
func (w *worker) Load(ctx context.Context, req *workerkit.LoadRequest) (*workerkit.LoadResponse, error) {
	start := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.enc != nil {
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "load: already loaded")
	}
	rt, err := w.base.Open(req)
	if err != nil {
		return nil, classify(fmt.Errorf("load: %w", err))
	}
	// the SiglipImageProcessor: transformers 5's torchvision one (the default, which made the
	// parity fixtures) or transformers 4's Pillow path (the original FramePack's)
	backend, err := siglip.ParseBackend(req.SiglipProcessor)
	if err != nil {
		rt.Close()
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "load: %v", err)
	}
	encDir, feDir, err := modelDirs(req.ModelDir)
	if err != nil {
		rt.Close()
		return nil, err
	}
	// Activations in fp16 on a GPU (FramePack's image encoder dtype), fp32 on the cpu, unless
	// the request or the activation test knob says otherwise; dtype says what the weight
	// matrices are kept in ("fp16"/"bf16", or "auto": the checkpoint's own dtype).
	act, wdt, err := w.base.Activation(req, rt, siglip.FramePackDType)
	if err != nil {
		rt.Close()
		return nil, classify(fmt.Errorf("load: %w", err))
	}
	enc, err := siglip.LoadEncoder(rt, encDir, feDir, backend, siglip.LoadOptions{DType: act, WeightDType: wdt})
	if err != nil {
		rt.Close()
		return nil, classify(fmt.Errorf("load: %w", err))
	}
	if err := ctx.Err(); err != nil {
		enc.Free()
		rt.Close()
		return nil, fmt.Errorf("load: %w", err)
	}
	w.rt, w.enc = rt, enc

	rep := enc.Model.Report()
	cfg := enc.Model.Config
	pc := enc.Processor.Config()
	w.log.WithFields(logrus.Fields{
		"image_encoder": encDir, "feature_extractor": feDir, "processor": string(backend),
		"layers": cfg.NumHiddenLayers, "hidden": cfg.HiddenSize, "image_size": cfg.ImageSize,
		"patch_size": cfg.PatchSize, "resize": fmt.Sprintf("%dx%d", pc.Height, pc.Width),
		"tensors": rep.Loaded, "weight_bytes": rep.Bytes, "staged_bytes": rep.StagedBytes, "weights": wdt.String(), "prefix": rep.Prefix,
		"duration": time.Since(start).Round(time.Millisecond).String(),
	}).Info("siglip loaded")
	if len(rep.Skipped) > 0 {
		w.log.WithFields(logrus.Fields{"count": len(rep.Skipped), "first": rep.Skipped[0]}).
			Info("pooling head tensors skipped: last_hidden_state does not use them")
	}
	if len(rep.Unexpected) > 0 {
		w.log.WithFields(logrus.Fields{"count": len(rep.Unexpected), "names": strings.Join(rep.Unexpected, ",")}).
			Warn("unexpected checkpoint tensors ignored")
	}
	return w.base.Loaded(rt, start, rep.Bytes), nil
}

// Run runs one image_encode stage.
func (w *worker) Run(ctx context.Context, req *workerkit.RunRequest, emit workerkit.Emit) (*workerkit.Result, error) {
	st, ok := req.Stage.(*workerkit.ImageEncodeRequest)
	if !ok {
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "run: the clipvision worker runs image_encode, got %T", req.Stage)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.enc == nil {
		return nil, workerkit.Errorf(workerkit.CodeInternal, "run: not loaded")
	}
	start := time.Now()
	log := w.log.WithField("stage", "image_encode")
	if req.JobID != "" {
		log = log.WithField("job", req.JobID)
	}
	res, err := w.encode(ctx, st, emit, start)
	w.base.AddCompute(start)
	if err != nil {
		err = classify(fmt.Errorf("image_encode: %w", err))
		log.WithError(err).WithField("code", workerkit.CodeOf(err).String()).Warn("stage failed")
		return nil, err
	}
	log.WithField("duration", time.Since(start).Round(time.Millisecond).String()).Info("stage done")
	res.Stats = w.base.Stats()
	return res, nil
}

func (w *worker) encode(ctx context.Context, st *workerkit.ImageEncodeRequest, emit workerkit.Emit, start time.Time) (*workerkit.Result, error) {
	if err := tensorio.CheckFloatOutput(lastHiddenState, st.LastHiddenState); err != nil {
		return nil, err
	}
	img, err := readImage(st.Image)
	if err != nil {
		return nil, err
	}
	defer img.close()
	if err := emit(&workerkit.Progress{Phase: "preprocess", Elapsed: time.Since(start)}); err != nil {
		return nil, fmt.Errorf("emit: %w", err)
	}
	enc := w.enc
	pv, err := enc.Processor.Preprocess(img.pix, img.height, img.width, img.channels)
	if err != nil {
		return nil, err
	}
	oh, ow := enc.Processor.OutputSize(img.height, img.width)
	n := enc.Model.Config.NumHiddenLayers
	hook := func(i int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := w.base.InjectedOOM(); err != nil {
			return err // injected out of memory (a test fault)
		}
		w.base.Beacon.SetStep(i, n)
		for _, ev := range w.base.DrainConvEvents() {
			if err := emit(&ev); err != nil {
				return err
			}
		}
		if i == 0 {
			return nil
		}
		return emit(&workerkit.Progress{Phase: "encode", Step: uint32(i), TotalSteps: uint32(n), Elapsed: time.Since(start)})
	}
	out, shape, err := enc.Model.ForwardHost(pv, []int{1, 3, oh, ow}, hook)
	w.base.Beacon.SetStep(0, 0)
	if err == nil {
		err = w.base.InjectedOOM() // injected out of memory in the last layer (a test fault)
	}
	if err != nil {
		return nil, err
	}
	if err := emit(&workerkit.Progress{Phase: "write", Elapsed: time.Since(start)}); err != nil {
		return nil, fmt.Errorf("emit: %w", err)
	}
	ref, err := tensorio.WriteFloat(lastHiddenState, st.LastHiddenState, out, tensorio.Shape64(shape))
	if err != nil {
		return nil, err
	}
	return &workerkit.Result{Outputs: []workerkit.TensorRef{ref}}, nil
}

// classify gives err the protocol code the supervisor acts on (unless it already has one): bad
// input, out of memory, device lost, cancelled, else internal.
func classify(err error) error {
	return modelrt.Classify(err, siglip.ErrBadInput, siglip.ErrCheckpoint)
}

// Stats reports memory, timings, op counts and conv tiers; it does not wait for a running stage.
func (w *worker) Stats(context.Context) (*workerkit.Stats, error) {
	return w.base.Stats(), nil
}
