// Package nn is the toolkit every model package of the workers is written with (textenc's CLIP
// and Llama, clipvision's SigLIP, the transformer's packed DiT, the causal VAE): one checkpoint
// loader that checks names, shapes and dtypes both ways (or makes random weights, or only
// records shapes), one forward-pass style (Pass: a sticky error and a scope of intermediates),
// and the layers the models share: Linear, LayerNorm, RMSNorm, GroupNorm, Conv2d/Conv3d,
// multi-head attention, activations by their transformers names, the CLIP-family MLP and an
// embedding table that stays in the mapped checkpoint.
package nn

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"

	"github.com/framepackd/framepackd/internal/fp8"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// ErrBadInput is wrapped by forward errors caused by the caller's input (a token id outside
// the vocabulary, a sequence longer than the model's positions); workers map it to
// InvalidArgument.
var ErrBadInput = errors.New("bad input")

// ErrCheckpoint is wrapped by load errors about the checkpoint's tensors (missing, wrong shape,
// not a float type) and by config errors the weights contradict. Retrying cannot help.
var ErrCheckpoint = errors.New("bad checkpoint")

// TensorError names the checkpoint tensor a load problem is about; it wraps ErrCheckpoint.
type TensorError struct {
	Name    string // full checkpoint key ("decoder.conv_in.conv.weight")
	Problem string // "missing (expected shape [..])", "got shape [..], expected [..]", ...
}

// Error implements error.
func (e *TensorError) Error() string { return "tensor " + e.Name + ": " + e.Problem }

// Unwrap makes errors.Is(err, ErrCheckpoint) hold.
func (e *TensorError) Unwrap() error { return ErrCheckpoint }

// maxLoadErrors is how many tensor problems a load error lists before summarising.
const maxLoadErrors = 8

// Source is a set of named tensors: *safetensors.Checkpoint or *safetensors.File.
type Source interface {
	runtime.TensorSource
	Names() []string
}

// Loader binds checkpoint tensors to the typed fields of a model at load. Every bind checks the
// tensor's name, shape and dtype; problems are collected (Err names every missing, mis-shaped
// or non-float tensor, not only the first), and once there is one nothing more is uploaded.
// Every tensor it hands out is tracked, so a failed load frees what it uploaded (Free) and a
// finished load reports the checkpoint tensors nobody asked for (Report).
//
// Besides a checkpoint (NewLoader) a loader can make seeded random weights (NewRandomLoader:
// benchmarks of configs without a checkpoint) or only record the shapes a model asks for
// (NewShapeLoader: size estimates, synthetic checkpoints in tests); binds then return nil.
//
// Dtype rules: Tensor uploads as the loader's dtype (norms, biases, embeddings added to
// activations); Weight uploads weight matrices the runtime reads in 16 bits (Linear, conv and
// embedding tables) as the weight dtype: F16, BF16, runtime.AsStored (the checkpoint's own
// dtype; F32 for random weights) or, by default, the loader's dtype.
//
// With staged upload on (SetStaging; by default on a device backend, the test knob EnvStagedUpload) a tensor already in the dtype it
// is uploaded as is copied through a ring of pinned host slots on a copy stream (staging.go);
// its bytes are ordered before any later work on the runtime's stream, and Finish or Free waits
// for them, so a load must end with one of the two.
type Loader struct {
	rt     *runtime.Runtime
	src    Source                   // checkpoint mode
	rng    *rand.Rand               // random mode
	shapes map[string][]int         // shape mode
	empty  bool                     // empty mode: tensors without contents (NewEmptyLoader)
	sdtype map[string]runtime.DType // shape mode: the dtype each bind asked for
	dtype  runtime.DType
	wdtype runtime.DType
	prefix string

	used    map[string]bool
	skipped map[string]bool
	loaded  []*runtime.Tensor
	bytes   int64
	errs    []error

	host      *HostSource   // BeginHost..EndHost: binds go to host memory
	hosts     []*HostSource // every host copy BeginHost made (freed by Free)
	hostStrip string
	hostBytes int64
	hostViews []string // BeginHost..EndHost: tensors copied straight from the checkpoint's mapping

	staging     Staging      // SetStaging; off: every tensor through LoadTensor
	ring        *stagingRing // made at the first staged tensor, freed by Finish and Free
	stagedBytes int64

	quant       *fp8.Layout     // the source's 8-bit weights (nil: none)
	quantize    bool            // Options.QuantizeLinear
	requantized bool            // LinearWeight quantized an 8-bit weight a LoRA changed
	linear      map[string]bool // shape mode: the names LinearWeight bound
}

// Options are the dtypes a model's weights are uploaded in (every model package's load options).
type Options struct {
	// DType is the model's activation dtype and the dtype of the tensors Tensor binds (norms,
	// biases, embeddings added to activations), as a model cast whole to it holds them; 0
	// means F32.
	DType runtime.DType
	// WeightDType is the dtype of the weight matrices Weight binds (Linear, convolution and
	// embedding tables: nearly all the bytes): F16 or BF16 keep them in 16 bits,
	// runtime.AsStored in the checkpoint's dtype; 0 means DType. A Linear weight stored in 8 bits
	// stays in 8 bits whatever this says (LinearWeight).
	WeightDType runtime.DType
	// QuantizeLinear quantizes the Linear weights LinearWeight binds that are stored in 16 or 32
	// bits to e4m3 with one scale per output channel, at load (fp8.Quantized).
	QuantizeLinear bool
}

// NewLoader returns a loader that uploads tensors of src into rt as o says. prefix is put in
// front of every name asked for ("model." for a LlamaForCausalLM checkpoint, "" for LlamaModel).
func NewLoader(rt *runtime.Runtime, src Source, o Options, prefix string) *Loader {
	dt, wdt := o.DType, o.WeightDType
	if dt == 0 {
		dt = runtime.F32
	}
	if wdt == 0 {
		wdt = dt
	}
	l := &Loader{rt: rt, src: src, dtype: dt, wdtype: wdt, prefix: prefix, used: map[string]bool{}, skipped: map[string]bool{},
		quantize: o.QuantizeLinear, linear: map[string]bool{}}
	l.SetStaging(StagingFromEnv(rt == nil || rt.Backend().IsHost))
	if src != nil {
		l.quant, l.errs = detectFP8(src, l.errs)
		if l.quant != nil {
			for _, n := range l.quant.Aux {
				l.used[n] = true
			}
		}
	}
	return l
}

// NewRandomLoader returns a loader that makes every tensor from a generator seeded with seed,
// as PyTorch's default init would in distribution: uniform ±1/√fan_in for matrices and
// convolutions, 1 ± 0.1 for 1-D ".weight" tensors (norms), ±0.02 for the rest.
func NewRandomLoader(rt *runtime.Runtime, seed uint64, o Options) *Loader {
	l := NewLoader(rt, nil, o, "")
	l.rng = rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	return l
}

// NewShapeLoader returns a loader that uploads nothing and only records the name and shape of
// every tensor asked for (Shapes).
func NewShapeLoader() *Loader { return NewShapeLoaderFor(Options{}) }

// NewShapeLoaderFor is NewShapeLoader recording, in ShapeDTypes, the dtypes a loader with
// options o would upload each tensor as (size estimates of 16-bit weights).
func NewShapeLoaderFor(o Options) *Loader {
	l := NewLoader(nil, nil, o, "")
	l.shapes = map[string][]int{}
	l.sdtype = map[string]runtime.DType{}
	return l
}

// NewEmptyLoader returns a loader that binds every tensor asked for as a new tensor of rt with
// that shape and the dtype a loader with options o would upload it as, without contents (a
// weight dtype of runtime.AsStored binds F32): a model on a shape-only runtime (runtime.Options
// ShapeOnly) whose forward measures memory.
func NewEmptyLoader(rt *runtime.Runtime, o Options) *Loader {
	l := NewLoader(rt, nil, o, "")
	l.empty = true
	return l
}

// DetectPrefix returns the first of prefixes under which src holds name ("" included if
// listed), so one loader serves checkpoints saved with or without a wrapper module.
func DetectPrefix(src runtime.TensorSource, name string, prefixes ...string) (string, error) {
	for _, p := range prefixes {
		if _, ok := src.Info(p + name); ok {
			return p, nil
		}
	}
	if len(prefixes) == 0 {
		return "", &TensorError{Name: name, Problem: "missing"}
	}
	quoted := make([]string, len(prefixes)-1)
	for i, p := range prefixes[1:] {
		quoted[i] = fmt.Sprintf("%q", p)
	}
	return "", &TensorError{Name: prefixes[0] + name, Problem: "missing (also looked under " + strings.Join(quoted, ", ") + ")"}
}

// OpenDir reads a model folder for a model package's Load: its config.json through loadConfig,
// then its checkpoint (one file or a sharded index). The caller closes the checkpoint: once the
// weights are uploaded, or with the model when the model keeps reading it (HostEmbedding).
func OpenDir[C any](dir string, loadConfig func(dir string) (C, error)) (C, *safetensors.Checkpoint, error) {
	cfg, err := loadConfig(dir)
	if err != nil {
		return cfg, nil, err
	}
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		return cfg, nil, err
	}
	return cfg, ck, nil
}

// Join joins module path parts with dots, skipping empty ones: Join("blocks", 3, "attn") is
// "blocks.3.attn".
func Join(parts ...any) string {
	var sb strings.Builder
	for _, p := range parts {
		s := fmt.Sprint(p)
		if s == "" {
			continue
		}
		if sb.Len() > 0 {
			sb.WriteByte('.')
		}
		sb.WriteString(s)
	}
	return sb.String()
}

// Prefix returns the prefix the loader puts in front of names.
func (l *Loader) Prefix() string { return l.prefix }

// DType returns the dtype Tensor uploads as.
func (l *Loader) DType() runtime.DType { return l.dtype }

// Fail records a load problem that is not about one tensor (a config the weights contradict).
func (l *Loader) Fail(err error) {
	if err != nil {
		l.errs = append(l.errs, err)
	}
}

// Err returns every problem found so far (errors.Is ErrCheckpoint for tensor problems), or nil.
func (l *Loader) Err() error {
	if len(l.errs) == 0 {
		return nil
	}
	errs := l.errs
	if len(errs) > maxLoadErrors {
		errs = append(slices.Clone(errs[:maxLoadErrors]), fmt.Errorf("and %d more tensor problems", len(l.errs)-maxLoadErrors))
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

func (l *Loader) problem(name, format string, args ...any) {
	l.errs = append(l.errs, &TensorError{Name: name, Problem: fmt.Sprintf(format, args...)})
}

// check looks name (prefix added) up and checks its shape and that it is a float type the
// runtime stores; it records a problem and returns false when not.
func (l *Loader) check(full string, shape []int) (safetensors.TensorInfo, bool) {
	l.used[full] = true
	info, ok := l.src.Info(full)
	if !ok {
		l.problem(full, "missing (expected shape %v)", shape)
		return info, false
	}
	got := make([]int, len(info.Shape))
	for i, d := range info.Shape {
		got[i] = int(d)
	}
	if !slices.Equal(got, shape) {
		l.problem(full, "got shape %v, expected %v", got, shape)
		return info, false
	}
	if !info.DType.IsFloat() {
		l.problem(full, "dtype %s is not a float type the runtime stores", info.DType)
		return info, false
	}
	return info, true
}

// storedAs reports whether a tensor stored as info says is already in dt (runtime.AsStored:
// whatever runtime dtype it is stored in), so its bytes can be used as they are, and returns
// that dtype.
func storedAs(info safetensors.TensorInfo, dt runtime.DType) (runtime.DType, bool) {
	sdt, ok := runtime.DTypeOf(info.DType)
	if !ok || (dt != runtime.AsStored && dt != sdt) {
		return 0, false
	}
	return sdt, true
}

// Tensor binds name (prefix added) with exactly shape, uploaded as the loader's dtype. It
// returns nil after a problem (recorded for Err) and in shape mode.
func (l *Loader) Tensor(name string, shape ...int) *runtime.Tensor {
	return l.bind(l.dtype, name, shape)
}

// Weight is Tensor for a weight matrix the runtime may read in 16 bits (a Linear's or a
// convolution's weight, an embedding table): uploaded as the weight dtype.
func (l *Loader) Weight(name string, shape ...int) *runtime.Tensor {
	return l.bind(l.wdtype, name, shape)
}

func (l *Loader) bind(dt runtime.DType, name string, shape []int) *runtime.Tensor {
	return l.bindAs(dt, name, shape, false)
}

// bindAs is bind; with stored8 a tensor stored in 8 bits is bound as stored (a Linear weight
// LinearWeight pairs with its scales), without it as dt (AsStored: BF16), dequantized.
func (l *Loader) bindAs(dt runtime.DType, name string, shape []int, stored8 bool) *runtime.Tensor {
	full := l.prefix + name
	switch {
	case l.shapes != nil:
		l.used[full] = true
		l.shapes[full] = slices.Clone(shape)
		l.sdtype[full] = dt
		return nil
	case l.empty:
		l.used[full] = true
		if len(l.errs) > 0 {
			return nil
		}
		if dt == runtime.AsStored {
			dt = runtime.F32
		}
		t, err := l.rt.NewTensor(dt, shape...)
		return l.keep(full, t, err)
	case l.rng != nil:
		l.used[full] = true
		if len(l.errs) > 0 {
			return nil
		}
		if l.host != nil {
			l.toHost(full, dt, shape, safetensors.TensorInfo{})
			return nil
		}
		t, err := l.random(full, shape, dt)
		return l.keep(full, t, err)
	}
	info, ok := l.check(full, shape)
	if !ok || len(l.errs) > 0 {
		return nil
	}
	if info.DType.IsFP8() && !stored8 {
		if dt == runtime.AsStored {
			dt = runtime.BF16 // exact for an unscaled 8-bit value
		}
		if qw := l.quant.Weight(full); qw.Scaled() {
			return l.bindDequantized(full, qw, dt, shape)
		}
	}
	if l.host != nil {
		l.toHost(full, dt, shape, info)
		return nil
	}
	t, err := l.upload(full, info, dt, shape)
	if err != nil {
		if errors.Is(err, runtime.ErrOutOfMemory) || errors.Is(err, errStaging) {
			l.errs = append(l.errs, fmt.Errorf("tensor %s: %w", full, err))
		} else {
			l.errs = append(l.errs, fmt.Errorf("%w: %w", &TensorError{Name: full, Problem: "unreadable"}, err))
		}
		return nil
	}
	return l.keep(full, t, nil)
}

// upload puts checkpoint tensor full (described by info) into the runtime as dt: through the
// staging ring where the loader stages and the tensor fits a slot, else by LoadTensor; the
// checkpoint's pages of it are released once copied.
func (l *Loader) upload(full string, info safetensors.TensorInfo, dt runtime.DType, shape []int) (*runtime.Tensor, error) {
	if sdt, n, ok := l.stageable(info, dt); ok {
		return l.loadStaged(full, sdt, shape, n)
	}
	t, err := l.rt.LoadTensor(l.src, full, dt)
	if err == nil {
		l.release(full)
	}
	return t, err
}

func (l *Loader) keep(full string, t *runtime.Tensor, err error) *runtime.Tensor {
	if err != nil {
		l.errs = append(l.errs, fmt.Errorf("tensor %s: %w", full, err))
		return nil
	}
	l.loaded = append(l.loaded, t)
	l.bytes += int64(t.NumBytes())
	return t
}

// randomValues fills a tensor of shape as NewRandomLoader describes.
func (l *Loader) randomValues(name string, shape []int) []float32 {
	n := numElements(shape)
	v := make([]float32, n)
	lo, hi := float32(-0.02), float32(0.02)
	switch {
	case len(shape) >= 2 && n > 0:
		bound := float32(1 / math.Sqrt(float64(n/shape[0])))
		lo, hi = -bound, bound
	case strings.HasSuffix(name, ".weight"):
		lo, hi = 0.9, 1.1
	}
	for i := range v {
		v[i] = lo + (hi-lo)*l.rng.Float32()
	}
	return v
}

func (l *Loader) random(name string, shape []int, dt runtime.DType) (*runtime.Tensor, error) {
	t, err := l.rt.FromFloat32(l.randomValues(name, shape), shape...)
	if err != nil || dt == runtime.F32 || dt == runtime.AsStored {
		return t, err
	}
	defer t.Free()
	return l.rt.Cast(t, dt)
}

// Raw returns the stored bytes of tensor name (a view into the mapped checkpoint; random F32
// bytes in random mode) and their dtype, for tensors the caller uses on the host
// (HostEmbedding gathers rows from it). It returns nil bytes after a problem and in shape mode.
func (l *Loader) Raw(name string, shape ...int) (runtime.DType, []byte) {
	full := l.prefix + name
	switch {
	case l.shapes != nil:
		l.used[full] = true
		l.shapes[full] = slices.Clone(shape)
		return runtime.F32, nil
	case l.rng != nil:
		l.used[full] = true
		v := l.randomValues(full, shape)
		raw := make([]byte, 4*len(v))
		for i, x := range v {
			b := math.Float32bits(x)
			raw[4*i], raw[4*i+1], raw[4*i+2], raw[4*i+3] = byte(b), byte(b>>8), byte(b>>16), byte(b>>24)
		}
		return runtime.F32, raw
	}
	info, ok := l.check(full, shape)
	if !ok {
		return 0, nil
	}
	dt, ok := runtime.DTypeOf(info.DType)
	if !ok {
		l.problem(full, "dtype %s is not a float type the runtime stores", info.DType)
		return 0, nil
	}
	raw, err := l.src.Bytes(full)
	if err != nil {
		l.errs = append(l.errs, fmt.Errorf("%w: %w", &TensorError{Name: full, Problem: "unreadable"}, err))
		return 0, nil
	}
	return dt, raw
}

// Skip marks checkpoint tensors whose names start with prefix (loader prefix added) as known
// but deliberately not loaded (layers a forward pass never reaches).
func (l *Loader) Skip(prefix string) { l.SkipRoot(l.prefix + prefix) }

// SkipRoot is Skip without the loader's prefix, for tensors outside the wrapped module (a
// causal LM's lm_head next to its "model." body).
func (l *Loader) SkipRoot(prefix string) {
	if l.src == nil {
		return
	}
	for _, n := range l.src.Names() {
		if strings.HasPrefix(n, prefix) && !l.used[n] {
			l.skipped[n] = true
		}
	}
}

// Shapes returns the tensors asked for and their shapes (shape mode; nil otherwise).
func (l *Loader) Shapes() map[string][]int { return l.shapes }

// ShapeDTypes returns the dtype each tensor of Shapes would be uploaded as (shape mode):
// F32 for Tensor binds, the weight dtype (runtime.AsStored included) for Weight binds.
func (l *Loader) ShapeDTypes() map[string]runtime.DType { return l.sdtype }

// ShapeBytes is the size the tensors of Shapes would take in the runtime (shape mode): each
// in its ShapeDTypes dtype, one kept as stored in src's dtype for prefix+name (F32 when src is
// nil or lacks it). A Linear weight (LinearWeight) stored in 8 bits counts 8 bits and its scales;
// any other tensor stored in 8 bits and kept as stored counts as BF16 (what it is widened to).
func (l *Loader) ShapeBytes(src Source, prefix string) int64 {
	var layout *fp8.Layout
	if src != nil {
		layout, _ = fp8.Detect(src) // a bad layout fails the real load
	}
	var n int64
	for name, shape := range l.shapes {
		dt := l.sdtype[name]
		var info safetensors.TensorInfo
		stored := false
		if src != nil {
			info, stored = src.Info(prefix + name)
		}
		elems := int64(1)
		for _, d := range shape {
			elems *= int64(d)
		}
		var scales int64
		switch {
		case l.linear[name] && stored && info.DType.IsFP8():
			dt = runtime.StoredDType(info.DType)
			if w := layout.Weight(prefix + name); w.Scaled() {
				scales = int64(w.Rows * w.Blocks)
			}
		case l.linear[name] && (dt.IsFP8() || requantize(src, prefix+name)): // quantized at load: a scale per output channel
			dt = runtime.F8E4M3
			scales = int64(shape[0])
		case dt == runtime.AsStored && stored && info.DType.IsFP8():
			dt = runtime.BF16
		case dt == runtime.AsStored && stored:
			dt = runtime.StoredDType(info.DType)
		case dt == runtime.AsStored:
			dt = runtime.F32
		}
		n += elems*int64(dt.Size()) + 4*scales
	}
	return n
}

// Tensors returns every tensor uploaded so far (the caller owns them once loading succeeded;
// with staged upload the host may read them only after Finish).
func (l *Loader) Tensors() []*runtime.Tensor { return slices.Clone(l.loaded) }

// Free frees every tensor uploaded and every host copy made so far (after a failed load),
// once every staged copy has finished, and the staging ring.
func (l *Loader) Free() {
	l.closeRing()
	for _, t := range l.loaded {
		t.Free()
	}
	l.loaded = nil
	l.bytes, l.stagedBytes = 0, 0
	for _, h := range l.hosts {
		_ = h.Free() // an unmap cannot fail for a mapping of ours; nothing to do if it did
	}
	l.hosts = nil
	l.hostBytes = 0
}

// Weights are the tensors a finished load uploaded; the model that embeds them owns them.
type Weights struct {
	tensors []*runtime.Tensor
	bytes   int64
	params  int64
	staged  int64
}

// WeightBytes is the size of the weights in the runtime's memory.
func (w *Weights) WeightBytes() int64 { return w.bytes }

// StagedBytes is the part of WeightBytes uploaded through the staging ring (SetStaging).
func (w *Weights) StagedBytes() int64 { return w.staged }

// NumTensors is the number of weight tensors held.
func (w *Weights) NumTensors() int { return len(w.tensors) }

// NumParams is the number of weight elements.
func (w *Weights) NumParams() int64 { return w.params }

// Free frees the weights.
func (w *Weights) Free() {
	for _, t := range w.tensors {
		t.Free()
	}
	w.tensors = nil
}

// Finish ends a load: on a problem it frees everything (host copies included) and returns Err;
// else it hands the uploaded tensors over as Weights, with the report (the host copies belong
// to whoever BeginHost gave them to).
//
// With staged upload it first waits until every tensor's copy has arrived and frees the ring,
// so the weights it hands over may be read on any stream and from the host.
func (l *Loader) Finish() (Weights, Report, error) {
	l.closeRing()
	if err := l.Err(); err != nil {
		l.Free()
		return Weights{}, Report{}, err
	}
	w := Weights{tensors: l.Tensors(), bytes: l.bytes, staged: l.stagedBytes}
	for _, t := range w.tensors {
		w.params += int64(t.NumElements())
	}
	l.loaded = nil
	l.hosts = nil // their BlockStreams own them now
	return w, l.Report(), nil
}

// Report says what a load did with the checkpoint's tensors.
type Report struct {
	// Prefix is the name prefix the checkpoint uses ("" or a wrapper module's, "vision_model.").
	Prefix string
	// Loaded is the number of checkpoint tensors bound to the model.
	Loaded int
	// Bytes is the size of the uploaded weights in the runtime's memory.
	Bytes int64
	// StagedBytes is the part of Bytes uploaded through the staging ring (SetStaging).
	StagedBytes int64
	// Skipped lists tensors deliberately left in the checkpoint (never computed).
	Skipped []string
	// Unexpected lists tensors the model does not know (neither loaded nor skipped).
	Unexpected []string
}

// Report returns what has been loaded, skipped and left over so far.
func (l *Loader) Report() Report {
	r := Report{Prefix: l.prefix, Loaded: len(l.used), Bytes: l.bytes, StagedBytes: l.stagedBytes}
	if l.src == nil {
		return r
	}
	for _, n := range l.src.Names() {
		switch {
		case l.used[n]:
		case l.skipped[n]:
			r.Skipped = append(r.Skipped, n)
		default:
			r.Unexpected = append(r.Unexpected, n)
		}
	}
	sort.Strings(r.Skipped)
	sort.Strings(r.Unexpected)
	return r
}
