package siglip

import (
	"fmt"
	"testing"
)

// BenchmarkPreprocess is the processor on FramePack's 640-bucket start frame (544×704) to 384²,
// for both backends.
func BenchmarkPreprocess(b *testing.B) {
	pix := texture(544, 704, 3)
	cfg := DefaultProcessorConfig()
	cfg.Height, cfg.Width = 384, 384
	for _, be := range []Backend{BackendTorchvision, BackendPIL} {
		b.Run(fmt.Sprintf("%s/544x704to384", be), func(b *testing.B) {
			p, err := NewProcessor(cfg, be)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(pix)))
			for b.Loop() {
				if _, err := p.Preprocess(pix, 544, 704, 3); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
