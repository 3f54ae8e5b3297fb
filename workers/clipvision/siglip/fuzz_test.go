package siglip

import (
	"errors"
	"testing"
)

// FuzzPreprocess feeds arbitrary sizes, channel counts and bytes to both backends: the result is
// either ErrBadInput or pixel values of the configured size, never a panic.
func FuzzPreprocess(f *testing.F) {
	f.Add(uint16(1), uint16(1), uint8(3), []byte{1, 2, 3})
	f.Add(uint16(3), uint16(2), uint8(4), make([]byte, 24))
	f.Add(uint16(0), uint16(5), uint8(1), []byte{})
	f.Add(uint16(2), uint16(2), uint8(7), make([]byte, 28))
	cfg := DefaultProcessorConfig()
	cfg.Height, cfg.Width = 14, 9
	procs := make([]*Processor, 0, 2)
	for _, b := range []Backend{BackendTorchvision, BackendPIL} {
		p, err := NewProcessor(cfg, b)
		if err != nil {
			f.Fatal(err)
		}
		procs = append(procs, p)
	}
	f.Fuzz(func(t *testing.T, h, w uint16, c uint8, pix []byte) {
		hh, ww := int(h%300), int(w%300)
		for _, p := range procs {
			out, err := p.Preprocess(pix, hh, ww, int(c))
			if err != nil {
				if !errors.Is(err, ErrBadInput) {
					t.Fatalf("%dx%dx%d (%d bytes): error %v is not ErrBadInput", hh, ww, c, len(pix), err)
				}
				continue
			}
			if len(out) != 3*14*9 {
				t.Fatalf("%d values", len(out))
			}
			for _, v := range out {
				if v < -1 || v > 1 {
					t.Fatalf("value %g outside [-1, 1]", v)
				}
			}
		}
	})
}
