package siglip

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/framepackd/framepackd/internal/imageproc"
)

// Backend selects which implementation of transformers' SiglipImageProcessor Preprocess
// reproduces. The two differ only in the resize, by at most one level on a few per cent of the
// pixels (about 2e-3 relative L2 on pixel_values).
type Backend string

const (
	// BackendTorchvision is transformers 5's default SiglipImageProcessor (a TorchvisionBackend):
	// the uint8 HWC image becomes a uint8 CHW tensor, is resized by torchvision with bicubic
	// antialiasing (PyTorch's native uint8 kernel: int16 weights, a = −0.5), and is rescaled and
	// normalised in one float32 step, (x − mean/rescale) / (std/rescale). The parity fixtures
	// were made with it (transformers 5.17).
	BackendTorchvision Backend = "torchvision"
	// BackendPIL is the Pillow path: transformers 4's SiglipImageProcessor, which the real
	// FramePack used when it was released (and transformers 5's SiglipImageProcessorPil): a PIL
	// BICUBIC resize (22-bit fixed point), then x·rescale in float64 rounded to float32, then
	// (x − mean) / std in float32.
	BackendPIL Backend = "pil"
)

// ParseBackend parses a backend name; "" means BackendTorchvision.
func ParseBackend(s string) (Backend, error) {
	switch Backend(s) {
	case "", BackendTorchvision:
		return BackendTorchvision, nil
	case BackendPIL:
		return BackendPIL, nil
	}
	return "", fmt.Errorf("siglip processor backend %q: want %q or %q", s, BackendTorchvision, BackendPIL)
}

// pilBicubic is PIL.Image.Resampling.BICUBIC, the only resample filter supported.
const pilBicubic = 3

// ProcessorConfig is SiglipImageProcessor's preprocessor_config.json. Absent keys take the
// class defaults of transformers' SiglipImageProcessor.
type ProcessorConfig struct {
	DoResize      bool       // do_resize (default true)
	Height, Width int        // size {"height", "width"} (default 224 × 224)
	Resample      int        // resample: PIL filter number; only 3 (BICUBIC, the default)
	DoRescale     bool       // do_rescale (default true)
	RescaleFactor float64    // rescale_factor (default 1/255)
	DoNormalize   bool       // do_normalize (default true)
	ImageMean     [3]float64 // image_mean (default 0.5 each)
	ImageStd      [3]float64 // image_std (default 0.5 each)
	DoConvertRGB  bool       // do_convert_rgb (default true)
}

// DefaultProcessorConfig returns SiglipImageProcessor's defaults.
func DefaultProcessorConfig() ProcessorConfig {
	return ProcessorConfig{DoResize: true, Height: 224, Width: 224, Resample: pilBicubic,
		DoRescale: true, RescaleFactor: 1.0 / 255, DoNormalize: true,
		ImageMean: [3]float64{0.5, 0.5, 0.5}, ImageStd: [3]float64{0.5, 0.5, 0.5}, DoConvertRGB: true}
}

type rawProcessorConfig struct {
	ImageProcessorType string           `json:"image_processor_type"`
	DoResize           *bool            `json:"do_resize"`
	Size               *json.RawMessage `json:"size"`
	Resample           *int             `json:"resample"`
	DoRescale          *bool            `json:"do_rescale"`
	RescaleFactor      *float64         `json:"rescale_factor"`
	DoNormalize        *bool            `json:"do_normalize"`
	ImageMean          json.RawMessage  `json:"image_mean"`
	ImageStd           json.RawMessage  `json:"image_std"`
	DoConvertRGB       *bool            `json:"do_convert_rgb"`
}

// perChannel decodes a mean or std given as one number or a list of three.
func perChannel(raw json.RawMessage, name string, dst *[3]float64) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var one float64
	if err := json.Unmarshal(raw, &one); err == nil {
		*dst = [3]float64{one, one, one}
		return nil
	}
	var list []float64
	if err := json.Unmarshal(raw, &list); err != nil || len(list) != 3 {
		return fmt.Errorf("%s must be a number or a list of 3 numbers", name)
	}
	copy(dst[:], list)
	return nil
}

// LoadProcessorConfig reads and validates dir/preprocessor_config.json.
func LoadProcessorConfig(dir string) (ProcessorConfig, error) {
	path := filepath.Join(dir, "preprocessor_config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return ProcessorConfig{}, fmt.Errorf("siglip processor config: %w", err)
	}
	c, err := ParseProcessorConfig(raw)
	if err != nil {
		return ProcessorConfig{}, fmt.Errorf("siglip processor config %s: %w", path, err)
	}
	return c, nil
}

// ParseProcessorConfig decodes and validates the JSON of a preprocessor_config.json.
func ParseProcessorConfig(raw []byte) (ProcessorConfig, error) {
	var r rawProcessorConfig
	if err := json.Unmarshal(raw, &r); err != nil {
		return ProcessorConfig{}, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	c := DefaultProcessorConfig()
	if r.ImageProcessorType != "" && r.ImageProcessorType != "SiglipImageProcessor" &&
		r.ImageProcessorType != "SiglipImageProcessorFast" && r.ImageProcessorType != "SiglipImageProcessorPil" {
		return ProcessorConfig{}, fmt.Errorf("%w: image_processor_type %q is not a SiglipImageProcessor", ErrCheckpoint, r.ImageProcessorType)
	}
	set := func(dst *bool, src *bool) {
		if src != nil {
			*dst = *src
		}
	}
	set(&c.DoResize, r.DoResize)
	set(&c.DoRescale, r.DoRescale)
	set(&c.DoNormalize, r.DoNormalize)
	set(&c.DoConvertRGB, r.DoConvertRGB)
	if r.Size != nil {
		var s map[string]int
		if err := json.Unmarshal(*r.Size, &s); err != nil {
			return ProcessorConfig{}, fmt.Errorf("%w: size: %w", ErrCheckpoint, err)
		}
		h, hok := s["height"]
		w, wok := s["width"]
		if !hok || !wok || len(s) != 2 {
			return ProcessorConfig{}, fmt.Errorf("%w: size %s: want {\"height\", \"width\"}", ErrCheckpoint, string(*r.Size))
		}
		c.Height, c.Width = h, w
	}
	if r.Resample != nil {
		c.Resample = *r.Resample
	}
	if r.RescaleFactor != nil {
		c.RescaleFactor = *r.RescaleFactor
	}
	if err := perChannel(r.ImageMean, "image_mean", &c.ImageMean); err != nil {
		return ProcessorConfig{}, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	if err := perChannel(r.ImageStd, "image_std", &c.ImageStd); err != nil {
		return ProcessorConfig{}, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	if err := c.Validate(); err != nil {
		return ProcessorConfig{}, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	return c, nil
}

// Validate checks the values Preprocess relies on.
func (c ProcessorConfig) Validate() error {
	if c.DoResize {
		if c.Height <= 0 || c.Width <= 0 {
			return fmt.Errorf("size %dx%d must be positive", c.Height, c.Width)
		}
		if c.Resample != pilBicubic {
			return fmt.Errorf("resample %d is not supported (only 3, BICUBIC)", c.Resample)
		}
	}
	if c.DoRescale && (!(c.RescaleFactor > 0) || math.IsInf(c.RescaleFactor, 0)) {
		return fmt.Errorf("rescale_factor %g must be positive", c.RescaleFactor)
	}
	if c.DoNormalize {
		for i, s := range c.ImageStd {
			if s == 0 || math.IsNaN(s) || math.IsInf(s, 0) || math.IsNaN(c.ImageMean[i]) {
				return fmt.Errorf("image_std %v / image_mean %v: std must be finite and nonzero", c.ImageStd, c.ImageMean)
			}
		}
	}
	return nil
}

// Processor turns uint8 images into SigLIP pixel values as transformers' SiglipImageProcessor
// does, with the chosen backend.
type Processor struct {
	cfg     ProcessorConfig
	backend Backend
}

// NewProcessor returns a processor for cfg; backend "" means BackendTorchvision.
func NewProcessor(cfg ProcessorConfig, backend Backend) (*Processor, error) {
	b, err := ParseBackend(string(backend))
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("siglip processor: %w", err)
	}
	return &Processor{cfg: cfg, backend: b}, nil
}

// Config returns the processor's config.
func (p *Processor) Config() ProcessorConfig { return p.cfg }

// Backend returns the backend the processor reproduces.
func (p *Processor) Backend() Backend { return p.backend }

// OutputSize returns the height and width of the pixel values for an input of h × w.
func (p *Processor) OutputSize(h, w int) (int, int) {
	if p.cfg.DoResize {
		return p.cfg.Height, p.cfg.Width
	}
	return h, w
}

// maxInputPixels bounds the input image (the pipeline's images are at most a few megapixels).
const maxInputPixels = 1 << 28

// ToRGB returns an HWC uint8 image of channels 1 (L), 2 (LA), 3 (RGB) or 4 (RGBA) as RGB, the way
// PIL's convert("RGB") does (do_convert_rgb): gray is replicated, alpha is dropped (not
// composited). Three channels are wrapped without copying.
func ToRGB(pix []uint8, height, width, channels int) (*imageproc.Image, error) {
	if height <= 0 || width <= 0 {
		return nil, fmt.Errorf("image %dx%d: %w: empty image", height, width, ErrBadInput)
	}
	if channels < 1 || channels > 4 {
		return nil, fmt.Errorf("image with %d channels: %w: want 1 (L), 2 (LA), 3 (RGB) or 4 (RGBA)", channels, ErrBadInput)
	}
	if height > maxInputPixels/width {
		return nil, fmt.Errorf("image %dx%d: %w: more than %d pixels", height, width, ErrBadInput, maxInputPixels)
	}
	n := height * width
	if len(pix) != n*channels {
		return nil, fmt.Errorf("image %dx%dx%d: %w: %d bytes", height, width, channels, ErrBadInput, len(pix))
	}
	if channels == 3 {
		return &imageproc.Image{Width: width, Height: height, Pix: pix}, nil
	}
	m := imageproc.NewImage(width, height)
	for i := 0; i < n; i++ {
		src := pix[i*channels : (i+1)*channels]
		dst := m.Pix[3*i : 3*i+3]
		if channels <= 2 {
			dst[0], dst[1], dst[2] = src[0], src[0], src[0]
		} else {
			dst[0], dst[1], dst[2] = src[0], src[1], src[2]
		}
	}
	return m, nil
}

// Preprocess turns one HWC uint8 image (channels 1–4 with do_convert_rgb, else 3) into pixel
// values [3, H, W] (row-major, H × W from OutputSize): resize, rescale, normalise.
func (p *Processor) Preprocess(pix []uint8, height, width, channels int) ([]float32, error) {
	if !p.cfg.DoConvertRGB && channels != 3 {
		return nil, fmt.Errorf("siglip preprocess: image with %d channels: %w: want 3 (do_convert_rgb is off)", channels, ErrBadInput)
	}
	img, err := ToRGB(pix, height, width, channels)
	if err != nil {
		return nil, fmt.Errorf("siglip preprocess: %w", err)
	}
	if p.cfg.DoResize {
		switch p.backend {
		case BackendPIL:
			img, err = imageproc.SiglipResize(img, p.cfg.Width, p.cfg.Height)
		default:
			img, err = TorchResizeBicubic(img, p.cfg.Width, p.cfg.Height)
		}
		if err != nil {
			return nil, fmt.Errorf("siglip preprocess: %w", err)
		}
	}
	return p.normalize(img), nil
}

// normalize converts HWC uint8 to CHW float32 with the backend's rescale and normalisation
// arithmetic.
func (p *Processor) normalize(img *imageproc.Image) []float32 {
	c := p.cfg
	n := img.Width * img.Height
	out := make([]float32, 3*n)
	for ch := 0; ch < 3; ch++ {
		dst := out[ch*n : (ch+1)*n]
		switch {
		case p.backend == BackendTorchvision && c.DoNormalize:
			// _fuse_mean_std_and_rescale_factor: mean·(1/rescale) and std·(1/rescale) as float32
			// tensors, then tvF.normalize in float32.
			mean, std := float32(c.ImageMean[ch]), float32(c.ImageStd[ch])
			if c.DoRescale {
				inv := float32(1.0 / c.RescaleFactor)
				mean, std = mean*inv, std*inv
			}
			for i := range dst {
				dst[i] = (float32(img.Pix[3*i+ch]) - mean) / std
			}
		case p.backend == BackendTorchvision && c.DoRescale:
			r := float32(c.RescaleFactor)
			for i := range dst {
				dst[i] = float32(img.Pix[3*i+ch]) * r
			}
		case c.DoRescale || c.DoNormalize: // numpy: rescale in float64 → float32, normalise in float32
			mean, std := float32(c.ImageMean[ch]), float32(c.ImageStd[ch])
			for i := range dst {
				v := float32(img.Pix[3*i+ch])
				if c.DoRescale {
					v = float32(float64(img.Pix[3*i+ch]) * c.RescaleFactor)
				}
				if c.DoNormalize {
					v = (v - mean) / std
				}
				dst[i] = v
			}
		default:
			for i := range dst {
				dst[i] = float32(img.Pix[3*i+ch])
			}
		}
	}
	return out
}
