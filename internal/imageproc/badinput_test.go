package imageproc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// pngChunk encodes one PNG chunk with its CRC.
func pngChunk(typ string, body []byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.BigEndian, uint32(len(body)))
	b.WriteString(typ)
	b.Write(body)
	binary.Write(&b, binary.BigEndian, crc32.ChecksumIEEE(append([]byte(typ), body...)))
	return b.Bytes()
}

// craftedPNG is a PNG whose IHDR declares w × h RGB8 pixels followed by a tiny IDAT, so only a
// decoder that trusts the header before checking sizes would allocate for it.
func craftedPNG(w, h uint32) []byte {
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], w)
	binary.BigEndian.PutUint32(ihdr[4:], h)
	ihdr[8], ihdr[9] = 8, 2
	out := []byte("\x89PNG\r\n\x1a\n")
	out = append(out, pngChunk("IHDR", ihdr)...)
	out = append(out, pngChunk("IDAT", []byte{0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01})...)
	return append(out, pngChunk("IEND", nil)...)
}

// craftedJPEG is SOI + a baseline SOF0 declaring w × h and three components, the header of a
// scan (SOS) and EOI: no tables, no entropy-coded data.
func craftedJPEG(w, h uint16) []byte {
	sof := []byte{0xff, 0xc0, 0, 17, 8, byte(h >> 8), byte(h), byte(w >> 8), byte(w), 3,
		1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1}
	sos := []byte{0xff, 0xda, 0, 12, 3, 1, 0x00, 2, 0x11, 3, 0x11, 0, 63, 0}
	out := append([]byte{0xff, 0xd8}, sof...)
	out = append(out, sos...)
	return append(out, 0xff, 0xd9)
}

// craftedWebP is a RIFF/WEBP with a VP8X chunk declaring a w × h canvas (flags as given) and
// nothing else.
func craftedWebP(w, h uint32, flags byte) []byte {
	vp8x := make([]byte, 10)
	vp8x[0] = flags
	put24 := func(b []byte, v uint32) { b[0], b[1], b[2] = byte(v), byte(v>>8), byte(v>>16) }
	put24(vp8x[4:], w-1)
	put24(vp8x[7:], h-1)
	body := append([]byte("WEBPVP8X"), 10, 0, 0, 0)
	body = append(body, vp8x...)
	out := []byte("RIFF")
	out = binary.LittleEndian.AppendUint32(out, uint32(len(body)))
	return append(out, body...)
}

func encodePNG(t *testing.T, m image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, m); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeJPEG(t *testing.T, m image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := jpeg.Encode(&b, m, &jpeg.Options{Quality: 95}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "decode", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeBadInput(t *testing.T) {
	good := map[Format][]byte{
		FormatPNG:  readTestdata(t, "png_rgba.png"),
		FormatJPEG: readTestdata(t, "jpeg_420.jpg"),
		FormatWebP: readTestdata(t, "webp_lossy_odd.webp"),
	}
	tests := []struct {
		name string
		data []byte
		opts Options
		kind error
	}{
		{"empty", nil, Options{}, ErrEmpty},
		{"text", []byte("hello, I am a picture"), Options{}, ErrUnknownFormat},
		{"gif", []byte("GIF89a\x01\x00\x01\x00\x00\x00\x00;"), Options{}, ErrUnknownFormat},
		{"png zero width", craftedPNG(0, 5), Options{}, ErrZeroSize},
		{"png zero height", craftedPNG(5, 0), Options{}, ErrZeroSize},
		{"jpeg zero height", craftedJPEG(16, 0), Options{}, ErrZeroSize},
		{"png 20000x20000", craftedPNG(20000, 20000), Options{}, ErrTooLarge},
		{"jpeg 20000x20000", craftedJPEG(20000, 20000), Options{}, ErrTooLarge},
		{"webp 20000x20000", craftedWebP(20000, 20000, 0), Options{}, ErrTooLarge},
		{"custom limit", good[FormatPNG], Options{MaxPixels: 100}, ErrTooLarge},
		{"animated webp", craftedWebP(16, 16, 0x02), Options{}, ErrUnsupported},
		{"png signature, jpeg body", append([]byte("\x89PNG\r\n\x1a\n"), good[FormatJPEG]...), Options{}, ErrCorrupt},
		{"jpeg signature, png body", append([]byte{0xff, 0xd8, 0xff}, good[FormatPNG]...), Options{}, ErrCorrupt},
		{"webp riff, garbage", append([]byte("RIFF\x20\x00\x00\x00WEBPVP8 "), bytes.Repeat([]byte{0x5a}, 40)...), Options{}, ErrCorrupt},
		{"jpeg declared as png", good[FormatJPEG], Options{Declared: FormatPNG}, ErrFormatMismatch},
		{"png declared as webp", good[FormatPNG], Options{Declared: FormatWebP}, ErrFormatMismatch},
		{"png only signature", []byte("\x89PNG\r\n\x1a\n"), Options{}, ErrTruncated},
		{"png cut in half", good[FormatPNG][:len(good[FormatPNG])/2], Options{}, ErrTruncated},
		{"jpeg cut in half", good[FormatJPEG][:len(good[FormatJPEG])/2], Options{}, ErrTruncated},
		{"webp cut in half", good[FormatWebP][:len(good[FormatWebP])/2], Options{}, ErrTruncated},
		{"png without IEND", good[FormatPNG][:len(good[FormatPNG])-12], Options{}, ErrTruncated},
		{"jpeg header only", good[FormatJPEG][:200], Options{}, ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img, _, err := Decode(tt.data, tt.opts)
			if err == nil {
				t.Fatalf("decoded a %dx%d image, want %v", img.Width, img.Height, tt.kind)
			}
			if !errors.Is(err, tt.kind) || !errors.Is(err, ErrBadImage) {
				t.Fatalf("error %q is not %v", err, tt.kind)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %q is not a *DecodeError", err)
			}
			if tt.kind == ErrTooLarge && (de.Width == 0 || de.Height == 0) {
				t.Errorf("too-large error without the declared size: %v", err)
			}
			t.Logf("%s: %v", tt.name, err)
		})
	}
}

// TestPixelLimitBeforeDecode checks that a header declaring 20000×20000 is refused without
// allocating anything near the 1.6 GB its pixels would need.
func TestPixelLimitBeforeDecode(t *testing.T) {
	for _, data := range [][]byte{craftedPNG(20000, 20000), craftedJPEG(20000, 20000), craftedWebP(20000, 20000, 0x10)} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, _, err := Decode(data, Options{})
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrTooLarge) {
			t.Fatalf("%s: got %v, want ErrTooLarge", Sniff(data), err)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
			t.Errorf("%s: %d bytes allocated before refusing", Sniff(data), alloc)
		}
	}
	// With the limit lifted, the same PNG gets as far as its (missing) pixel data.
	if _, _, err := Decode(craftedPNG(3000, 3000), Options{MaxPixels: -1}); errors.Is(err, ErrTooLarge) || !errors.Is(err, ErrBadImage) {
		t.Errorf("no limit: got %v", err)
	}
}

// TestDecodeTruncatedEverywhere cuts valid files at every few bytes: each prefix is a clear error
// (or, for a prefix that is still a complete image, a valid one), never a panic.
func TestDecodeTruncatedEverywhere(t *testing.T) {
	for _, name := range []string{"png_palette.png", "jpeg_cmyk.jpg", "jpeg_422.jpg", "webp_alpha.webp", "webp_lossless.webp", "go_rgba16.png"} {
		data := readTestdata(t, name)
		for n := 0; n < len(data); n += 1 + len(data)/200 {
			_, _, err := Decode(data[:n], Options{})
			if err != nil && !errors.Is(err, ErrBadImage) {
				t.Errorf("%s[:%d]: %v is not a bad-image error", name, n, err)
			}
		}
	}
}

func TestDecodeOddValidInput(t *testing.T) {
	nrgba := image.NewNRGBA(image.Rect(0, 0, 3, 2))
	nrgba.SetNRGBA(0, 0, color.NRGBA{200, 100, 50, 0}) // fully transparent: colour kept
	nrgba.SetNRGBA(1, 0, color.NRGBA{10, 20, 30, 128})
	gray := image.NewGray(image.Rect(0, 0, 4, 3))
	for i := range gray.Pix {
		gray.Pix[i] = uint8(i * 20)
	}
	pal := image.NewPaletted(image.Rect(0, 0, 2, 2), color.Palette{color.RGBA{255, 0, 0, 255}, color.NRGBA{0, 0, 255, 10}})
	pal.SetColorIndex(1, 1, 1)
	g16 := image.NewGray16(image.Rect(0, 0, 2, 1))
	g16.SetGray16(0, 0, color.Gray16{0x00c8}) // 200: kept
	g16.SetGray16(1, 0, color.Gray16{0x1234}) // saturates, as Pillow's I;16 → RGB
	rgb16 := image.NewNRGBA64(image.Rect(0, 0, 1, 1))
	rgb16.SetNRGBA64(0, 0, color.NRGBA64{0x12ff, 0xab00, 0xffff, 0x0001})
	one := image.NewRGBA(image.Rect(0, 0, 1, 1))
	one.SetRGBA(0, 0, color.RGBA{1, 2, 3, 255})

	tests := []struct {
		name   string
		data   []byte
		w, h   int
		source string
		want   map[[2]int][3]uint8 // spot checks
	}{
		{"1x1 png", encodePNG(t, one), 1, 1, "rgb", map[[2]int][3]uint8{{0, 0}: {1, 2, 3}}},
		{"rgba png", encodePNG(t, nrgba), 3, 2, "rgba", map[[2]int][3]uint8{{0, 0}: {200, 100, 50}, {1, 0}: {10, 20, 30}}},
		{"gray png", encodePNG(t, gray), 4, 3, "gray", map[[2]int][3]uint8{{3, 2}: {220, 220, 220}}},
		{"palette png", encodePNG(t, pal), 2, 2, "paletted", map[[2]int][3]uint8{{0, 0}: {255, 0, 0}, {1, 1}: {0, 0, 255}}},
		{"16-bit gray png", encodePNG(t, g16), 2, 1, "gray16", map[[2]int][3]uint8{{0, 0}: {200, 200, 200}, {1, 0}: {255, 255, 255}}},
		{"16-bit rgba png", encodePNG(t, rgb16), 1, 1, "rgba16", map[[2]int][3]uint8{{0, 0}: {0x12, 0xab, 0xff}}},
		{"1x1 jpeg", encodeJPEG(t, one), 1, 1, "ycbcr", nil},
		{"gray jpeg", encodeJPEG(t, gray), 4, 3, "gray", nil},
		{"cmyk jpeg", readTestdata(t, "jpeg_cmyk.jpg"), 37, 23, "cmyk", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img, meta, err := Decode(tt.data, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if img.Width != tt.w || img.Height != tt.h || len(img.Pix) != tt.w*tt.h*3 {
				t.Fatalf("got %dx%d (%d bytes), want %dx%d", img.Width, img.Height, len(img.Pix), tt.w, tt.h)
			}
			if meta.Source != tt.source {
				t.Errorf("source %q, want %q", meta.Source, tt.source)
			}
			for p, want := range tt.want {
				r, g, b := img.RGB(p[0], p[1])
				if [3]uint8{r, g, b} != want {
					t.Errorf("pixel %v = %v, want %v", p, [3]uint8{r, g, b}, want)
				}
			}
		})
	}
}

func TestDecodeReaderLimits(t *testing.T) {
	data := readTestdata(t, "png_rgba.png")
	if _, _, err := DecodeReader(bytes.NewReader(data), int64(len(data)-1), Options{}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("byte limit: got %v", err)
	}
	img, meta, err := DecodeReader(bytes.NewReader(data), 0, Options{})
	if err != nil || img.Width != 37 || meta.Format != FormatPNG {
		t.Errorf("DecodeReader: %v %+v", err, meta)
	}
	if _, _, err := DecodeFile(filepath.Join("testdata", "decode", "missing.png"), Options{}); err == nil || errors.Is(err, ErrBadImage) {
		t.Errorf("missing file: got %v, want a plain I/O error", err)
	}
	img, meta, err = DecodeFile(filepath.Join("testdata", "decode", "jpeg_orient6.jpg"), Options{KeepOrientation: true})
	if err != nil || img.Width != 37 || img.Height != 23 || meta.Orientation != 6 {
		t.Errorf("keep orientation: %v %dx%d %+v", err, img.Width, img.Height, meta)
	}
	if FormatFromName("a.JPG") != FormatJPEG || FormatFromName("a.gif") != "" {
		t.Error("FormatFromName")
	}
}

// FuzzDecode feeds arbitrary bytes to Decode: it must return an image or a bad-image error, never
// panic, and a returned image must be consistent.
func FuzzDecode(f *testing.F) {
	for _, name := range []string{"png_palette.png", "png_orient6.png", "raw_gray16_trns.png", "jpeg_420.jpg", "jpeg_cmyk.jpg",
		"jpeg_orient6.jpg", "webp_alpha.webp", "webp_lossless.webp", "webp_orient6.webp"} {
		b, err := os.ReadFile(filepath.Join("testdata", "decode", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(craftedPNG(20000, 20000))
	f.Add(craftedWebP(16, 16, 0x02))
	f.Fuzz(func(t *testing.T, data []byte) {
		img, _, err := Decode(data, Options{MaxPixels: 1 << 20})
		if err != nil {
			if !errors.Is(err, ErrBadImage) {
				t.Fatalf("error %v is not a bad-image error", err)
			}
			return
		}
		if img.Width <= 0 || img.Height <= 0 || len(img.Pix) != img.Width*img.Height*3 {
			t.Fatalf("inconsistent image %dx%d with %d bytes", img.Width, img.Height, len(img.Pix))
		}
	})
}
