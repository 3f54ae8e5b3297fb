package imageproc

import (
	"bytes"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"io"
	"os"
	"strings"

	"golang.org/x/image/webp"
)

// DefaultMaxPixels is the pixel limit Decode applies when Options.MaxPixels is 0: 64 megapixels,
// comfortably above any camera image and far below what would exhaust the supervisor's memory.
const DefaultMaxPixels = 64_000_000

// DefaultMaxBytes is the size limit DecodeReader and DecodeFile apply when given 0.
const DefaultMaxBytes = 256 << 20

// Options tune Decode.
type Options struct {
	// MaxPixels refuses images with more pixels than this (width × height as declared in the
	// header), before any pixel data is decoded. 0 means DefaultMaxPixels; negative means no limit.
	MaxPixels int64
	// Declared, when set, is the format the caller was told (file extension, MIME type); content
	// of another format is refused with ErrFormatMismatch instead of being decoded.
	Declared Format
	// KeepOrientation leaves the pixels as stored instead of applying the EXIF orientation.
	KeepOrientation bool
}

// Meta describes a decoded image.
type Meta struct {
	Format Format
	// Width and Height are the stored size, before the orientation was applied.
	Width, Height int
	// Orientation is the EXIF orientation found (1 when none); Decode applied it unless
	// Options.KeepOrientation was set.
	Orientation int
	// Source names the stored pixel layout: "rgb", "rgba", "gray", "gray16", "rgb16", "rgba16",
	// "paletted", "cmyk", "ycbcr".
	Source string
}

// DecodeFile reads and decodes the image at path (at most DefaultMaxBytes bytes).
func DecodeFile(path string, opts Options) (*Image, Meta, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, Meta{}, fmt.Errorf("decode image: %w", err)
	}
	defer f.Close()
	img, meta, err := DecodeReader(f, 0, opts)
	if err != nil {
		return nil, meta, fmt.Errorf("%s: %w", path, err)
	}
	return img, meta, nil
}

// DecodeReader reads at most maxBytes (0: DefaultMaxBytes) from r and decodes them; a longer
// input is refused with ErrTooLarge.
func DecodeReader(r io.Reader, maxBytes int64, opts Options) (*Image, Meta, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	data, err := io.ReadAll(io.LimitReader(r, maxBytes+1))
	if err != nil {
		return nil, Meta{}, fmt.Errorf("decode image: read: %w", err)
	}
	if int64(len(data)) > maxBytes {
		return nil, Meta{}, &DecodeError{Format: Sniff(data), Kind: ErrTooLarge,
			Err: fmt.Errorf("more than %d bytes", maxBytes)}
	}
	return Decode(data, opts)
}

// Decode decodes a PNG, JPEG or WebP image (recognised by its signature) to RGB the way FramePack
// gets its input image from Pillow: Image.open, ImageOps.exif_transpose, convert("RGB").
//
//   - alpha is dropped without compositing (the stored colour of transparent pixels is kept);
//   - grayscale is replicated, palettes are looked up (their transparency ignored);
//   - 16-bit RGB(A) and gray+alpha keep the high byte of each sample, while 16-bit grayscale is
//     clamped to 255 — Pillow opens it as mode I;16 whose conversion to RGB saturates;
//   - CMYK/YCCK JPEGs use Pillow's cmyk2rgb: nk = 255−k, r = nk − nk·c/255 (rounded), no ICC;
//   - lossy WebP is converted with libwebp's BT.601 limited-range formula and fancy upsampling
//     (bit-exact with libwebp given the same planes, which VP8 defines exactly);
//   - YCbCr JPEGs use libjpeg's colour conversion and fancy chroma upsampling. Go's IDCT is not
//     libjpeg's, so JPEG pixels may differ from Pillow's by a few levels;
//   - the EXIF orientation (JPEG APP1, PNG eXIf, WebP EXIF) is applied unless KeepOrientation.
//
// Every failure caused by the input is a *DecodeError whose Kind is one of the Err* values; the
// pixel limit is checked from the header before the pixel data is decoded.
func Decode(data []byte, opts Options) (*Image, Meta, error) {
	if len(data) == 0 {
		return nil, Meta{}, decodeErr("", ErrEmpty, nil)
	}
	f := Sniff(data)
	if f == "" {
		return nil, Meta{}, decodeErr("", ErrUnknownFormat, fmt.Errorf("signature % x", data[:min(len(data), 8)]))
	}
	if opts.Declared != "" && opts.Declared != f {
		return nil, Meta{Format: f}, decodeErr(f, ErrFormatMismatch, fmt.Errorf("declared %s, content is %s", opts.Declared, f))
	}
	meta := Meta{Format: f, Orientation: 1}

	// Container metadata first: orientation, and what the Go decoders do not tell.
	var pngHdr pngHeader
	var exif []byte
	switch f {
	case FormatPNG:
		var err error
		if pngHdr, err = parsePNGHeader(data); err != nil {
			return nil, meta, err
		}
		if pngHdr.width == 0 || pngHdr.height == 0 {
			return nil, meta, &DecodeError{Format: f, Kind: ErrZeroSize, Width: pngHdr.width, Height: pngHdr.height}
		}
		exif = pngHdr.exif
	case FormatJPEG:
		exif = jpegExif(data)
	case FormatWebP:
		h := parseWebPHeader(data)
		if h.animated {
			return nil, meta, decodeErr(f, ErrUnsupported, errors.New("animated webp"))
		}
		exif = h.exif
	}
	if exif != nil {
		meta.Orientation = exifOrientation(exif)
	}

	// The header's size, checked against the limit before any pixel data is touched.
	cfg, err := guard(func() (image.Config, error) {
		switch f {
		case FormatPNG:
			return png.DecodeConfig(bytes.NewReader(data))
		case FormatJPEG:
			return jpeg.DecodeConfig(bytes.NewReader(data))
		default:
			return webp.DecodeConfig(bytes.NewReader(data))
		}
	})
	if err != nil {
		return nil, meta, classify(f, err)
	}
	meta.Width, meta.Height = cfg.Width, cfg.Height
	if cfg.Width <= 0 || cfg.Height <= 0 {
		return nil, meta, &DecodeError{Format: f, Kind: ErrZeroSize, Width: cfg.Width, Height: cfg.Height}
	}
	limit := opts.MaxPixels
	if limit == 0 {
		limit = DefaultMaxPixels
	}
	if limit > 0 && int64(cfg.Width)*int64(cfg.Height) > limit {
		return nil, meta, &DecodeError{Format: f, Kind: ErrTooLarge, Width: cfg.Width, Height: cfg.Height,
			Err: fmt.Errorf("%d pixels, limit %d", int64(cfg.Width)*int64(cfg.Height), limit)}
	}

	src, err := guard(func() (image.Image, error) {
		switch f {
		case FormatPNG:
			return png.Decode(bytes.NewReader(data))
		case FormatJPEG:
			return jpeg.Decode(bytes.NewReader(data))
		default:
			return webp.Decode(bytes.NewReader(data))
		}
	})
	if err != nil {
		return nil, meta, classify(f, err)
	}
	if b := src.Bounds(); b.Dx() != cfg.Width || b.Dy() != cfg.Height {
		return nil, meta, decodeErr(f, ErrCorrupt, fmt.Errorf("decoded %dx%d, header says %dx%d", b.Dx(), b.Dy(), cfg.Width, cfg.Height))
	}
	img, source := toRGB(src, f, pngHdr)
	meta.Source = source
	if !opts.KeepOrientation {
		img = orient(img, meta.Orientation)
	}
	return img, meta, nil
}

// guard runs a decoder call and turns a panic inside it into an error. Decoders validate their
// input, but a hostile file must not be able to take the supervisor down through a decoder bug.
func guard[T any](fn func() (T, error)) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &DecodeError{Kind: ErrCorrupt, Err: fmt.Errorf("decoder panic: %v", r)}
		}
	}()
	return fn()
}

// classify wraps a decoder error in a DecodeError of the right kind.
func classify(f Format, err error) error {
	var de *DecodeError
	if errors.As(err, &de) {
		de.Format = f
		return de
	}
	var (
		pngUnsupported  png.UnsupportedError
		jpegUnsupported jpeg.UnsupportedError
	)
	msg := err.Error()
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		strings.Contains(msg, "not enough pixel data") || strings.Contains(msg, "short Huffman data"):
		return decodeErr(f, ErrTruncated, err)
	case errors.As(err, &pngUnsupported) || errors.As(err, &jpegUnsupported):
		return decodeErr(f, ErrUnsupported, err)
	}
	return decodeErr(f, ErrCorrupt, err)
}

// toRGB converts a decoded image to RGB as Pillow's convert("RGB") would for the mode Pillow opens
// the same file in, and names the source layout.
func toRGB(src image.Image, f Format, hdr pngHeader) (*Image, string) {
	b := src.Bounds()
	w, h := b.Dx(), b.Dy()
	out := NewImage(w, h)
	px := out.Pix
	gray16 := f == FormatPNG && hdr.colorType == 0 && hdr.bitDepth == 16
	switch m := src.(type) {
	case *image.Gray:
		for y := 0; y < h; y++ {
			row := m.Pix[m.PixOffset(b.Min.X, b.Min.Y+y):][:w]
			for x, v := range row {
				i := (y*w + x) * 3
				px[i], px[i+1], px[i+2] = v, v, v
			}
		}
		return out, "gray"
	case *image.Gray16:
		for y := 0; y < h; y++ {
			row := m.Pix[m.PixOffset(b.Min.X, b.Min.Y+y):][:2*w]
			for x := 0; x < w; x++ {
				v := pillowI16ToL(row[2*x], row[2*x+1])
				i := (y*w + x) * 3
				px[i], px[i+1], px[i+2] = v, v, v
			}
		}
		return out, "gray16"
	case *image.RGBA: // opaque RGB (PNG without alpha, Adobe RGB JPEG): the colour as stored
		copyRGB(px, m.Pix, m.Stride, m.PixOffset(b.Min.X, b.Min.Y), w, h, 4)
		return out, "rgb"
	case *image.NRGBA:
		copyRGB(px, m.Pix, m.Stride, m.PixOffset(b.Min.X, b.Min.Y), w, h, 4)
		return out, "rgba"
	case *image.RGBA64: // opaque 16-bit RGB: high bytes
		copyRGB(px, m.Pix, m.Stride, m.PixOffset(b.Min.X, b.Min.Y), w, h, 8)
		return out, "rgb16"
	case *image.NRGBA64:
		if gray16 { // 16-bit gray with a tRNS colour: still Pillow mode I;16
			for y := 0; y < h; y++ {
				row := m.Pix[m.PixOffset(b.Min.X, b.Min.Y+y):][:8*w]
				for x := 0; x < w; x++ {
					v := pillowI16ToL(row[8*x], row[8*x+1])
					i := (y*w + x) * 3
					px[i], px[i+1], px[i+2] = v, v, v
				}
			}
			return out, "gray16"
		}
		copyRGB(px, m.Pix, m.Stride, m.PixOffset(b.Min.X, b.Min.Y), w, h, 8)
		return out, "rgba16"
	case *image.Paletted:
		var lut [256][3]uint8 // indices past the palette read black
		for i, c := range m.Palette {
			if i >= 256 {
				break
			}
			lut[i] = straightRGB(c)
		}
		for y := 0; y < h; y++ {
			row := m.Pix[m.PixOffset(b.Min.X, b.Min.Y+y):][:w]
			for x, idx := range row {
				i := (y*w + x) * 3
				c := lut[idx]
				px[i], px[i+1], px[i+2] = c[0], c[1], c[2]
			}
		}
		return out, "paletted"
	case *image.CMYK:
		for y := 0; y < h; y++ {
			row := m.Pix[m.PixOffset(b.Min.X, b.Min.Y+y):][:4*w]
			for x := 0; x < w; x++ {
				c, mm, yy, k := row[4*x], row[4*x+1], row[4*x+2], row[4*x+3]
				i := (y*w + x) * 3
				px[i], px[i+1], px[i+2] = pillowCMYKToRGB(c, k), pillowCMYKToRGB(mm, k), pillowCMYKToRGB(yy, k)
			}
		}
		return out, "cmyk"
	case *image.YCbCr:
		if f == FormatWebP {
			return webpYCbCrToRGB(m), "ycbcr"
		}
		return jpegYCbCrToRGB(m), "ycbcr"
	case *image.NYCbCrA: // lossy WebP with alpha: alpha dropped
		return webpYCbCrToRGB(&m.YCbCr), "ycbcra"
	}
	// Anything else: through the non-premultiplied colour model.
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			c := straightRGB(src.At(b.Min.X+x, b.Min.Y+y))
			i := (y*w + x) * 3
			px[i], px[i+1], px[i+2] = c[0], c[1], c[2]
		}
	}
	return out, "other"
}

// copyRGB copies the first three samples' high bytes of every pixel (bpp bytes per pixel: 4 for
// 8-bit RGBA, 8 for 16-bit big-endian RGBA).
func copyRGB(dst, src []uint8, stride, off, w, h, bpp int) {
	step := bpp / 4 // bytes per sample
	for y := 0; y < h; y++ {
		row := src[off+y*stride:][:w*bpp]
		d := dst[y*w*3:][:w*3]
		for x := 0; x < w; x++ {
			p := row[x*bpp:]
			d[3*x], d[3*x+1], d[3*x+2] = p[0], p[step], p[2*step]
		}
	}
}

// straightRGB returns the non-premultiplied 8-bit colour of c.
func straightRGB(c color.Color) [3]uint8 {
	switch v := c.(type) {
	case color.NRGBA:
		return [3]uint8{v.R, v.G, v.B}
	case color.RGBA:
		if v.A == 0xff {
			return [3]uint8{v.R, v.G, v.B}
		}
	}
	n := color.NRGBAModel.Convert(c).(color.NRGBA)
	return [3]uint8{n.R, n.G, n.B}
}

// pillowI16ToL is Pillow's I;16 → L/RGB rule: values above 255 saturate (no scaling).
func pillowI16ToL(hi, lo uint8) uint8 {
	if hi != 0 {
		return 255
	}
	return lo
}

// pillowCMYKToRGB is one channel of Pillow's cmyk2rgb: nk − round(v·nk/255), nk = 255 − k.
func pillowCMYKToRGB(v, k uint8) uint8 {
	nk := 255 - int32(k)
	t := int32(v)*nk + 128
	return clampU8(nk - ((t>>8)+t)>>8)
}
