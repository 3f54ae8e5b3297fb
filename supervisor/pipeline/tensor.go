package pipeline

import (
	"fmt"
	"math"

	"github.com/framepackd/framepackd/internal/imageproc"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
)

// vol is a float32 [B, C, T, H, W] tensor: pixels (C = 3) or latents (C = 16).
type vol = imageproc.Video

func zeros(b, c, t, h, w int) vol {
	return vol{B: b, C: c, T: t, H: h, W: w, Data: make([]float32, b*c*t*h*w)}
}

func shape64(v vol) []int64 {
	return []int64{int64(v.B), int64(v.C), int64(v.T), int64(v.H), int64(v.W)}
}

// sliceT returns frames [t0, t1) of v (a copy).
func sliceT(v vol, t0, t1 int) vol {
	out := zeros(v.B, v.C, t1-t0, v.H, v.W)
	frame := v.H * v.W
	for bc := 0; bc < v.B*v.C; bc++ {
		copy(out.Data[bc*out.T*frame:(bc+1)*out.T*frame], v.Data[(bc*v.T+t0)*frame:(bc*v.T+t1)*frame])
	}
	return out
}

// concatT concatenates along T (torch.cat(dim=2)); all parts share B, C, H, W.
func concatT(parts ...vol) (vol, error) {
	if len(parts) == 0 {
		return vol{}, fmt.Errorf("concat: no tensors")
	}
	p0 := parts[0]
	t := 0
	for _, p := range parts {
		if p.B != p0.B || p.C != p0.C || p.H != p0.H || p.W != p0.W {
			return vol{}, fmt.Errorf("concat: shapes %v and %v differ outside T", p0.Shape(), p.Shape())
		}
		t += p.T
	}
	out := zeros(p0.B, p0.C, t, p0.H, p0.W)
	frame := p0.H * p0.W
	for bc := 0; bc < p0.B*p0.C; bc++ {
		off := bc * t * frame
		for _, p := range parts {
			n := p.T * frame
			copy(out.Data[off:off+n], p.Data[bc*n:(bc+1)*n])
			off += n
		}
	}
	return out, nil
}

// sampleB returns batch sample b of v (a copy) with B = 1.
func sampleB(v vol, b int) vol {
	n := v.C * v.T * v.H * v.W
	out := zeros(1, v.C, v.T, v.H, v.W)
	copy(out.Data, v.Data[b*n:(b+1)*n])
	return out
}

// concatB stacks volumes of one shape along B (torch.cat(dim=0)).
func concatB(parts ...vol) (vol, error) {
	if len(parts) == 0 {
		return vol{}, fmt.Errorf("concat: no tensors")
	}
	p0 := parts[0]
	out := vol{C: p0.C, T: p0.T, H: p0.H, W: p0.W}
	for _, p := range parts {
		if p.C != p0.C || p.T != p0.T || p.H != p0.H || p.W != p0.W {
			return vol{}, fmt.Errorf("concat: shapes %v and %v differ outside B", p0.Shape(), p.Shape())
		}
		out.B += p.B
		out.Data = append(out.Data, p.Data...)
	}
	return out, nil
}

// scaled returns v × f, computed in float32 (the reference's float32 history tensors).
func scaled(v vol, f float32) vol {
	out := vol{B: v.B, C: v.C, T: v.T, H: v.H, W: v.W, Data: make([]float32, len(v.Data))}
	for i, x := range v.Data {
		out.Data[i] = x * f
	}
	return out
}

// divided returns v / f in float32 (vae_decode's latents / scaling_factor).
func divided(v vol, f float32) vol {
	out := vol{B: v.B, C: v.C, T: v.T, H: v.H, W: v.W, Data: make([]float32, len(v.Data))}
	for i, x := range v.Data {
		out.Data[i] = x / f
	}
	return out
}

// f32Tensor makes a safetensors F32 tensor of v.
func f32Tensor(name string, v vol) safetensors.Tensor {
	return safetensors.FromFloat32(name, shape64(v), v.Data)
}

// tensorSource is a safetensors file or segment, mapped.
type tensorSource interface {
	Info(name string) (safetensors.TensorInfo, bool)
	Float32(name string) ([]float32, []int64, error)
	Bytes(name string) ([]byte, error)
}

// readVol reads a rank-5 float tensor.
func readVol(src tensorSource, name string) (vol, error) {
	data, shape, err := src.Float32(name)
	if err != nil {
		return vol{}, fmt.Errorf("read %s: %w", name, err)
	}
	if len(shape) != 5 {
		return vol{}, fmt.Errorf("read %s: shape %v, want [B, C, T, H, W]", name, shape)
	}
	for _, d := range shape {
		if d < 0 || d > math.MaxInt32 {
			return vol{}, fmt.Errorf("read %s: shape %v", name, shape)
		}
	}
	v := vol{B: int(shape[0]), C: int(shape[1]), T: int(shape[2]), H: int(shape[3]), W: int(shape[4]), Data: data}
	if len(data) != v.B*v.C*v.T*v.H*v.W {
		return vol{}, fmt.Errorf("read %s: %d values for shape %v", name, len(data), shape)
	}
	for _, x := range data {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return vol{}, fmt.Errorf("read %s: not finite (%v)", name, x)
		}
	}
	return v, nil
}

// readRaw copies a tensor's raw bytes out of src.
func readRaw(src tensorSource, name string) (safetensors.Tensor, error) {
	info, ok := src.Info(name)
	if !ok {
		return safetensors.Tensor{}, fmt.Errorf("read %s: no such tensor", name)
	}
	b, err := src.Bytes(name)
	if err != nil {
		return safetensors.Tensor{}, fmt.Errorf("read %s: %w", name, err)
	}
	return safetensors.Tensor{Name: name, DType: info.DType, Shape: append([]int64(nil), info.Shape...), Data: append([]byte(nil), b...)}, nil
}

// readSegmentVol opens a complete shared-memory segment and reads one rank-5 float tensor.
func readSegmentVol(path, name string) (vol, error) {
	m, err := shm.Open(path)
	if err != nil {
		return vol{}, err
	}
	defer m.Close()
	return readVol(m, name)
}
