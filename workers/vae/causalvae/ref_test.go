package causalvae

// A float64 reference of AutoencoderKLHunyuanVideo written loop by loop from the diffusers
// source (58eb52c), independent of the runtime and of the model's own plan code, to check
// configs the fixture set does not cover (other channels, block counts, ratios, no attention).

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/framepackd/framepackd/internal/safetensors"
)

// arr is a float64 array [B, C, T, H, W].
type arr struct {
	s [5]int
	d []float64
}

func newArr(s [5]int) arr { return arr{s: s, d: make([]float64, s[0]*s[1]*s[2]*s[3]*s[4])} }

func (a arr) i(b, c, t, h, w int) int {
	return (((b*a.s[1]+c)*a.s[2]+t)*a.s[3]+h)*a.s[4] + w
}

func arrOf(v Volume) arr {
	a := newArr(v.Shape)
	for i, x := range v.Data {
		a.d[i] = float64(x)
	}
	return a
}

func (a arr) float32s() []float32 {
	out := make([]float32, len(a.d))
	for i, x := range a.d {
		out[i] = float32(x)
	}
	return out
}

// memCheckpoint is an in-memory checkpoint of F32 tensors.
type memCheckpoint struct {
	info map[string]safetensors.TensorInfo
	data map[string][]byte
	f64  map[string][]float64
}

func (m *memCheckpoint) Info(name string) (safetensors.TensorInfo, bool) {
	i, ok := m.info[name]
	return i, ok
}

func (m *memCheckpoint) Bytes(name string) ([]byte, error) {
	b, ok := m.data[name]
	if !ok {
		return nil, fmt.Errorf("no tensor %s", name)
	}
	return b, nil
}

func (m *memCheckpoint) Names() []string {
	var out []string
	for n := range m.info {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (m *memCheckpoint) put(name string, shape []int, v []float32) {
	s64 := make([]int64, len(shape))
	for i, d := range shape {
		s64[i] = int64(d)
	}
	raw := make([]byte, 4*len(v))
	f := make([]float64, len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(x))
		f[i] = float64(x)
	}
	m.info[name] = safetensors.TensorInfo{Name: name, DType: safetensors.F32, Shape: s64, End: int64(len(raw))}
	m.data[name] = raw
	m.f64[name] = f
}

// randomCheckpoint makes weights for cfg: convs and linears scaled by 1/sqrt(fan-in), norms
// near identity, small biases.
func randomCheckpoint(cfg Config, seed uint64) (*memCheckpoint, error) {
	shapes, err := cfg.TensorShapes()
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	m := &memCheckpoint{info: map[string]safetensors.TensorInfo{}, data: map[string][]byte{}, f64: map[string][]float64{}}
	names := make([]string, 0, len(shapes))
	for n := range shapes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s := shapes[n]
		size := 1
		for _, d := range s {
			size *= d
		}
		v := make([]float32, size)
		isNorm := len(s) == 1 && (contains(n, "norm"))
		for i := range v {
			switch {
			case len(s) == 1 && isNorm && n[len(n)-6:] == "weight":
				v[i] = float32(1 + 0.2*rng.NormFloat64())
			case len(s) == 1:
				v[i] = float32(0.1 * rng.NormFloat64())
			default:
				fan := size / s[0]
				v[i] = float32(rng.NormFloat64() / math.Sqrt(float64(fan)))
			}
		}
		m.put(n, s, v)
	}
	return m, nil
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// refVAE is the float64 reference forward.
type refVAE struct {
	cfg Config
	w   map[string][]float64
	s   map[string][]int64
}

func (r *refVAE) causalConv(x arr, name string, stride [3]int) arr {
	wt, ws := r.w[name+".conv.weight"], r.s[name+".conv.weight"]
	bias := r.w[name+".conv.bias"]
	co, ci, kt, kh, kw := int(ws[0]), int(ws[1]), int(ws[2]), int(ws[3]), int(ws[4])
	// F.pad(x, (kw//2, kw//2, kh//2, kh//2, kt-1, 0), mode="replicate")
	pt, ph, pw := kt-1, kh/2, kw/2
	T := (x.s[2]+pt-kt)/stride[0] + 1
	H := (x.s[3]+2*ph-kh)/stride[1] + 1
	W := (x.s[4]+2*pw-kw)/stride[2] + 1
	clamp := func(v, n int) int { return min(max(v, 0), n-1) }
	out := newArr([5]int{x.s[0], co, T, H, W})
	for b := range x.s[0] {
		for o := range co {
			for t := range T {
				for h := range H {
					for w := range W {
						sum := bias[o]
						for c := range ci {
							for dt := range kt {
								tt := clamp(t*stride[0]+dt-pt, x.s[2])
								for dh := range kh {
									hh := clamp(h*stride[1]+dh-ph, x.s[3])
									for dw := range kw {
										ww := clamp(w*stride[2]+dw-pw, x.s[4])
										sum += wt[(((o*ci+c)*kt+dt)*kh+dh)*kw+dw] * x.d[x.i(b, c, tt, hh, ww)]
									}
								}
							}
						}
						out.d[out.i(b, o, t, h, w)] = sum
					}
				}
			}
		}
	}
	return out
}

func (r *refVAE) conv1(x arr, name string) arr {
	wt, bias := r.w[name+".weight"], r.w[name+".bias"]
	co, ci := int(r.s[name+".weight"][0]), x.s[1]
	out := newArr([5]int{x.s[0], co, x.s[2], x.s[3], x.s[4]})
	n := x.s[2] * x.s[3] * x.s[4]
	for b := range x.s[0] {
		for o := range co {
			for p := range n {
				sum := bias[o]
				for c := range ci {
					sum += wt[o*ci+c] * x.d[(b*ci+c)*n+p]
				}
				out.d[(b*co+o)*n+p] = sum
			}
		}
	}
	return out
}

func (r *refVAE) groupNorm(x arr, name string) arr {
	g := r.cfg.NormNumGroups
	wt, bias := r.w[name+".weight"], r.w[name+".bias"]
	C := x.s[1]
	n := x.s[2] * x.s[3] * x.s[4]
	cpg := C / g
	out := newArr(x.s)
	for b := range x.s[0] {
		for gi := range g {
			lo := (b*C + gi*cpg) * n
			hi := lo + cpg*n
			mean := 0.0
			for _, v := range x.d[lo:hi] {
				mean += v
			}
			mean /= float64(hi - lo)
			vr := 0.0
			for _, v := range x.d[lo:hi] {
				vr += (v - mean) * (v - mean)
			}
			vr /= float64(hi - lo)
			inv := 1 / math.Sqrt(vr+1e-6)
			for i := lo; i < hi; i++ {
				c := (i / n) % C
				out.d[i] = (x.d[i]-mean)*inv*wt[c] + bias[c]
			}
		}
	}
	return out
}

func silu(x arr) arr {
	out := newArr(x.s)
	for i, v := range x.d {
		out.d[i] = v / (1 + math.Exp(-v))
	}
	return out
}

func add(a, b arr) arr {
	out := newArr(a.s)
	for i := range a.d {
		out.d[i] = a.d[i] + b.d[i]
	}
	return out
}

func (r *refVAE) resnet(x arr, p string) arr {
	h := silu(r.groupNorm(x, p+".norm1"))
	h = r.causalConv(h, p+".conv1", [3]int{1, 1, 1})
	h = silu(r.groupNorm(h, p+".norm2"))
	h = r.causalConv(h, p+".conv2", [3]int{1, 1, 1})
	if _, ok := r.w[p+".conv_shortcut.conv.weight"]; ok {
		x = r.causalConv(x, p+".conv_shortcut", [3]int{1, 1, 1})
	}
	return add(h, x)
}

func (r *refVAE) linear(tok [][]float64, name string) [][]float64 {
	wt, bias := r.w[name+".weight"], r.w[name+".bias"]
	out := make([][]float64, len(tok))
	C := len(bias)
	in := len(tok[0])
	for i, row := range tok {
		o := make([]float64, C)
		for j := range C {
			s := bias[j]
			for k := range in {
				s += wt[j*in+k] * row[k]
			}
			o[j] = s
		}
		out[i] = o
	}
	return out
}

// attention is the mid block's Attention with prepare_causal_attention_mask: an explicit
// -inf mask where the key's frame index exceeds the query's.
func (r *refVAE) attention(x arr, p string) arr {
	B, C, T, H, W := x.s[0], x.s[1], x.s[2], x.s[3], x.s[4]
	HW := H * W
	L := T * HW
	gn := r.groupNorm(x, p+".group_norm")
	out := newArr(x.s)
	for b := range B {
		tok := make([][]float64, L)
		for l := range L {
			row := make([]float64, C)
			t, hw := l/HW, l%HW
			for c := range C {
				row[c] = gn.d[gn.i(b, c, t, hw/W, hw%W)]
			}
			tok[l] = row
		}
		q, k, v := r.linear(tok, p+".to_q"), r.linear(tok, p+".to_k"), r.linear(tok, p+".to_v")
		att := make([][]float64, L)
		scale := 1 / math.Sqrt(float64(C))
		for i := range L {
			s := make([]float64, L)
			mx := math.Inf(-1)
			for j := range L {
				mask := 0.0
				if j/HW+1 > i/HW+1 { // x <= y with x the key's frame, y the query's
					mask = math.Inf(-1)
				}
				dot := 0.0
				for c := range C {
					dot += q[i][c] * k[j][c]
				}
				s[j] = dot*scale + mask
				mx = math.Max(mx, s[j])
			}
			sum := 0.0
			for j := range L {
				s[j] = math.Exp(s[j] - mx)
				sum += s[j]
			}
			o := make([]float64, C)
			for j := range L {
				for c := range C {
					o[c] += s[j] / sum * v[j][c]
				}
			}
			att[i] = o
		}
		proj := r.linear(att, p+".to_out.0")
		for l := range L {
			t, hw := l/HW, l%HW
			for c := range C {
				idx := out.i(b, c, t, hw/W, hw%W)
				out.d[idx] = proj[l][c] + x.d[idx]
			}
		}
	}
	return out
}

func (r *refVAE) mid(x arr, p string) arr {
	x = r.resnet(x, p+".resnets.0")
	if r.cfg.MidBlockAddAttention {
		x = r.attention(x, p+".attentions.0")
	}
	return r.resnet(x, p+".resnets.1")
}

// upsample is HunyuanVideoUpsampleCausal3D: frame 0 upsampled in space only, the others by
// the full factor (nearest: out[i] = in[i / f]), concatenated, then the conv.
func (r *refVAE) upsample(x arr, p string, f [3]int) arr {
	T := 1 + (x.s[2]-1)*f[0]
	out := newArr([5]int{x.s[0], x.s[1], T, x.s[3] * f[1], x.s[4] * f[2]})
	for b := range x.s[0] {
		for c := range x.s[1] {
			for t := range T {
				src := 0
				if t > 0 {
					src = 1 + (t-1)/f[0]
				}
				for h := range out.s[3] {
					for w := range out.s[4] {
						out.d[out.i(b, c, t, h, w)] = x.d[x.i(b, c, src, h/f[1], w/f[2])]
					}
				}
			}
		}
	}
	return r.causalConv(out, p+".conv", [3]int{1, 1, 1})
}

func ilog2(n int) int {
	k := 0
	for n > 1 {
		n /= 2
		k++
	}
	return k
}

// encode is encoder + quant_conv, with HunyuanVideoEncoder3D's block rules (ratio 4).
func (r *refVAE) encode(x arr) arr {
	c := r.cfg
	bo := c.BlockOutChannels
	h := r.causalConv(x, "encoder.conv_in", [3]int{1, 1, 1})
	nS, nT := ilog2(c.SpatialCompressionRatio), ilog2(c.TemporalCompressionRatio)
	for i := range bo {
		final := i == len(bo)-1
		addS := i < nS
		addT := i >= len(bo)-1-nT && !final
		p := fmt.Sprintf("encoder.down_blocks.%d", i)
		for j := range c.LayersPerBlock {
			h = r.resnet(h, fmt.Sprintf("%s.resnets.%d", p, j))
		}
		if addS || addT {
			st := [3]int{1, 1, 1}
			if addT {
				st[0] = 2
			}
			if addS {
				st[1], st[2] = 2, 2
			}
			h = r.causalConv(h, p+".downsamplers.0.conv", st)
		}
	}
	h = r.mid(h, "encoder.mid_block")
	h = silu(r.groupNorm(h, "encoder.conv_norm_out"))
	h = r.causalConv(h, "encoder.conv_out", [3]int{1, 1, 1})
	return r.conv1(h, "quant_conv")
}

// decode is post_quant_conv + decoder, with HunyuanVideoDecoder3D's block rules.
func (r *refVAE) decode(z arr) arr {
	c := r.cfg
	bo := c.BlockOutChannels
	h := r.conv1(z, "post_quant_conv")
	h = r.causalConv(h, "decoder.conv_in", [3]int{1, 1, 1})
	h = r.mid(h, "decoder.mid_block")
	nS, nT := ilog2(c.SpatialCompressionRatio), ilog2(c.TemporalCompressionRatio)
	for i := range bo {
		final := i == len(bo)-1
		addS := i < nS
		addT := i >= len(bo)-1-nT && !final
		p := fmt.Sprintf("decoder.up_blocks.%d", i)
		for j := range c.LayersPerBlock + 1 {
			h = r.resnet(h, fmt.Sprintf("%s.resnets.%d", p, j))
		}
		if addS || addT {
			f := [3]int{1, 1, 1}
			if addT {
				f[0] = 2
			}
			if addS {
				f[1], f[2] = 2, 2
			}
			h = r.upsample(h, p+".upsamplers.0", f)
		}
	}
	h = silu(r.groupNorm(h, "decoder.conv_norm_out"))
	return r.causalConv(h, "decoder.conv_out", [3]int{1, 1, 1})
}

func newRefVAE(cfg Config, ck *memCheckpoint) *refVAE {
	r := &refVAE{cfg: cfg, w: ck.f64, s: map[string][]int64{}}
	for n, i := range ck.info {
		r.s[n] = i.Shape
	}
	return r
}
