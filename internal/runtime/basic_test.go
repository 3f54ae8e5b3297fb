package runtime

import (
	"math/rand/v2"
	"testing"
)

func refConv3d(x []float64, xs []int, w []float64, ws []int, b []float64, p Conv3dParams) ([]float64, []int) {
	p = p.norm()
	N, Cin, T, H, W := xs[0], xs[1], xs[2], xs[3], xs[4]
	Cout, Cg, kT, kH, kW := ws[0], ws[1], ws[2], ws[3], ws[4]
	G := p.Groups
	Cog := Cout / G
	To := (T+2*p.Padding[0]-kT)/p.Stride[0] + 1
	Ho := (H+2*p.Padding[1]-kH)/p.Stride[1] + 1
	Wo := (W+2*p.Padding[2]-kW)/p.Stride[2] + 1
	out := make([]float64, N*Cout*To*Ho*Wo)
	_ = Cin
	for n := range N {
		for co := range Cout {
			g := co / Cog
			for to := range To {
				for ho := range Ho {
					for wo := range Wo {
						acc := 0.0
						if b != nil {
							acc = b[co]
						}
						for ci := range Cg {
							cin := g*Cg + ci
							for a := range kT {
								ti := to*p.Stride[0] - p.Padding[0] + a
								if ti < 0 || ti >= T {
									continue
								}
								for bb := range kH {
									hi := ho*p.Stride[1] - p.Padding[1] + bb
									if hi < 0 || hi >= H {
										continue
									}
									for cc := range kW {
										wi := wo*p.Stride[2] - p.Padding[2] + cc
										if wi < 0 || wi >= W {
											continue
										}
										acc += x[(((n*Cin+cin)*T+ti)*H+hi)*W+wi] *
											w[(((co*Cg+ci)*kT+a)*kH+bb)*kW+cc]
									}
								}
							}
						}
						out[(((n*Cout+co)*To+to)*Ho+ho)*Wo+wo] = acc
					}
				}
			}
		}
	}
	return out, []int{N, Cout, To, Ho, Wo}
}

func TestConv3dSmoke(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	r := rand.New(rand.NewPCG(1, 2))
	x, xv := randTensor(t, rt, r, 1, 4, 3, 7, 5)
	w, wv := randTensor(t, rt, r, 6, 2, 3, 3, 2)
	b, bv := randTensor(t, rt, r, 6)
	p := Conv3dParams{Stride: [3]int{1, 2, 1}, Padding: [3]int{1, 1, 0}, Groups: 2}
	want, shape := refConv3d(xv, x.Shape(), wv, w.Shape(), bv, p)
	y, err := rt.Conv3d(x, w, b, p)
	check(t, "conv3d", y, err, shape, want)
	t.Log(rt.ConvStats().String())
}
