package imageproc

import (
	"bytes"
	"encoding/binary"
	"errors"
)

// exifOrientation reads tag 0x0112 (Orientation) of IFD0 from an Exif block: a TIFF header,
// optionally preceded by "Exif\0\0" (as in JPEG APP1; PNG eXIf and WebP EXIF chunks usually omit
// it). It returns 1 (no transform) when the block is malformed, lacks the tag or holds a value
// outside 1…8, as Pillow's exif_transpose leaves such images alone.
func exifOrientation(b []byte) int {
	b = bytes.TrimPrefix(b, []byte("Exif\x00\x00"))
	if len(b) < 8 {
		return 1
	}
	var bo binary.ByteOrder
	switch string(b[:4]) {
	case "II*\x00":
		bo = binary.LittleEndian
	case "MM\x00*":
		bo = binary.BigEndian
	default:
		return 1
	}
	off := uint64(bo.Uint32(b[4:8]))
	if off+2 > uint64(len(b)) {
		return 1
	}
	n := uint64(bo.Uint16(b[off:]))
	for i := uint64(0); i < n; i++ {
		e := off + 2 + 12*i
		if e+12 > uint64(len(b)) {
			return 1
		}
		if bo.Uint16(b[e:]) != 0x0112 {
			continue
		}
		typ, count := bo.Uint16(b[e+2:]), bo.Uint32(b[e+4:])
		if count < 1 {
			return 1
		}
		var v uint32
		switch typ {
		case 3: // SHORT, stored in the first two bytes of the value field
			v = uint32(bo.Uint16(b[e+8:]))
		case 4: // LONG
			v = bo.Uint32(b[e+8:])
		default:
			return 1
		}
		if v < 1 || v > 8 {
			return 1
		}
		return int(v)
	}
	return 1
}

// jpegExif returns the payload of the first APP1 segment that starts with "Exif\0\0", scanning the
// markers before the first SOS; nil when there is none or the marker structure is broken.
func jpegExif(b []byte) []byte {
	if len(b) < 4 || b[0] != 0xff || b[1] != 0xd8 {
		return nil
	}
	i := 2
	for i+4 <= len(b) {
		if b[i] != 0xff {
			return nil
		}
		m := b[i+1]
		if m == 0xff { // fill byte
			i++
			continue
		}
		if m == 0xd8 || (m >= 0xd0 && m <= 0xd7) || m == 0x01 { // markers without a length
			i += 2
			continue
		}
		if m == 0xda || m == 0xd9 { // SOS, EOI: no more metadata before the image data
			return nil
		}
		n := int(binary.BigEndian.Uint16(b[i+2:]))
		if n < 2 || i+2+n > len(b) {
			return nil
		}
		seg := b[i+4 : i+2+n]
		if m == 0xe1 && bytes.HasPrefix(seg, []byte("Exif\x00\x00")) {
			return seg
		}
		i += 2 + n
	}
	return nil
}

// pngHeader is what Decode needs from a PNG before decoding it: the IHDR fields and the eXIf
// chunk.
type pngHeader struct {
	width, height       int
	bitDepth, colorType int
	exif                []byte
}

// parsePNGHeader reads IHDR and walks the chunk list (by length only, no CRC) for eXIf. It fails
// with ErrTruncated when the data is too short to hold an IHDR and with ErrCorrupt when the first
// chunk is not one.
func parsePNGHeader(b []byte) (h pngHeader, err error) {
	const sig = 8
	if len(b) < sig+8+13 {
		return h, decodeErr(FormatPNG, ErrTruncated, errors.New("no complete IHDR chunk"))
	}
	if string(b[sig+4:sig+8]) != "IHDR" || binary.BigEndian.Uint32(b[sig:]) != 13 {
		return h, decodeErr(FormatPNG, ErrCorrupt, errors.New("first chunk is not IHDR"))
	}
	ihdr := b[sig+8:]
	h.width = int(binary.BigEndian.Uint32(ihdr[0:4]))
	h.height = int(binary.BigEndian.Uint32(ihdr[4:8]))
	h.bitDepth, h.colorType = int(ihdr[8]), int(ihdr[9])
	for i := sig; i+8 <= len(b); {
		n := uint64(binary.BigEndian.Uint32(b[i:]))
		typ := string(b[i+4 : i+8])
		end := uint64(i) + 8 + n + 4
		if end > uint64(len(b)) {
			break
		}
		if typ == "eXIf" && h.exif == nil {
			h.exif = b[i+8 : uint64(i)+8+n]
		}
		if typ == "IEND" {
			break
		}
		i = int(end)
	}
	return h, nil
}

// webpHeader is what Decode needs from a WebP before decoding it.
type webpHeader struct {
	animated bool
	exif     []byte
}

// parseWebPHeader walks the RIFF chunks for the VP8X animation flag and the EXIF chunk.
func parseWebPHeader(b []byte) webpHeader {
	var h webpHeader
	for i := 12; i+8 <= len(b); {
		id := string(b[i : i+4])
		n := uint64(binary.LittleEndian.Uint32(b[i+4:]))
		end := uint64(i) + 8 + n
		if end > uint64(len(b)) {
			break
		}
		body := b[i+8 : end]
		switch id {
		case "VP8X":
			if len(body) >= 1 && body[0]&0x02 != 0 {
				h.animated = true
			}
		case "ANIM", "ANMF":
			h.animated = true
		case "EXIF":
			if h.exif == nil {
				h.exif = body
			}
		}
		i = int(end + n&1) // chunks are padded to an even size
	}
	return h
}

// orient applies EXIF orientation o (1…8) as Pillow's ImageOps.exif_transpose does.
func orient(m *Image, o int) *Image {
	if o <= 1 || o > 8 {
		return m
	}
	w, h := m.Width, m.Height
	ow, oh := w, h
	if o >= 5 { // the transposing orientations swap width and height
		ow, oh = h, w
	}
	out := NewImage(ow, oh)
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			var dx, dy int
			switch o {
			case 2: // mirror horizontally
				dx, dy = w-1-x, y
			case 3: // rotate 180
				dx, dy = w-1-x, h-1-y
			case 4: // mirror vertically
				dx, dy = x, h-1-y
			case 5: // transpose (mirror about the main diagonal)
				dx, dy = y, x
			case 6: // rotate 90° clockwise
				dx, dy = h-1-y, x
			case 7: // transverse (mirror about the anti-diagonal)
				dx, dy = h-1-y, w-1-x
			case 8: // rotate 90° counter-clockwise
				dx, dy = y, w-1-x
			}
			s, d := (y*w+x)*3, (dy*ow+dx)*3
			out.Pix[d], out.Pix[d+1], out.Pix[d+2] = m.Pix[s], m.Pix[s+1], m.Pix[s+2]
		}
	}
	return out
}
