package imageproc

import "fmt"

// Video is a float32 pixel tensor in FramePack's [B, C, T, H, W] layout, values nominally in
// [-1, 1] (what the VAE decoder returns).
type Video struct {
	B, C, T, H, W int
	Data          []float32 // len = B*C*T*H*W, row-major
}

// Shape returns [B, C, T, H, W].
func (v Video) Shape() [5]int { return [5]int{v.B, v.C, v.T, v.H, v.W} }

func (v Video) check(what string) error {
	if v.B <= 0 || v.C <= 0 || v.T < 0 || v.H <= 0 || v.W <= 0 {
		return fmt.Errorf("%s: bad shape %v", what, v.Shape())
	}
	if len(v.Data) != v.B*v.C*v.T*v.H*v.W {
		return fmt.Errorf("%s: %d values for shape %v", what, len(v.Data), v.Shape())
	}
	return nil
}

// SoftAppend is FramePack's soft_append_bcthw(history, current, overlap): history's frames then
// current's, with the last `overlap` frames of history cross-faded into the first `overlap` of
// current by weights linspace(1, 0, overlap) on history. The result has
// T = history.T + current.T − overlap; overlap 0 concatenates.
//
// Mind the order at the call site: FramePack generates backwards in time and calls it as
// soft_append_bcthw(current_pixels, history_pixels, overlapped_frames), i.e. the newly decoded
// (earlier) section is the first argument.
func SoftAppend(history, current Video, overlap int) (Video, error) {
	if err := history.check("soft append: history"); err != nil {
		return Video{}, err
	}
	if err := current.check("soft append: current"); err != nil {
		return Video{}, err
	}
	if history.B != current.B || history.C != current.C || history.H != current.H || history.W != current.W {
		return Video{}, fmt.Errorf("soft append: history %v and current %v differ outside T", history.Shape(), current.Shape())
	}
	if overlap < 0 || overlap > history.T || overlap > current.T {
		return Video{}, fmt.Errorf("soft append: overlap %d with history T=%d and current T=%d", overlap, history.T, current.T)
	}
	out := Video{B: history.B, C: history.C, T: history.T + current.T - overlap, H: history.H, W: history.W}
	out.Data = make([]float32, out.B*out.C*out.T*out.H*out.W)
	frame := history.H * history.W
	weights := linspace(1, 0, overlap)
	for b := 0; b < out.B; b++ {
		for c := 0; c < out.C; c++ {
			h := history.Data[(b*history.C+c)*history.T*frame:][:history.T*frame]
			cur := current.Data[(b*current.C+c)*current.T*frame:][:current.T*frame]
			o := out.Data[(b*out.C+c)*out.T*frame:][:out.T*frame]
			keep := (history.T - overlap) * frame
			copy(o[:keep], h[:keep])
			for t := 0; t < overlap; t++ {
				w := weights[t]
				hf := h[(history.T-overlap+t)*frame:][:frame]
				cf := cur[t*frame:][:frame]
				of := o[keep+t*frame:][:frame]
				for i := range of {
					of[i] = float32(w*float64(hf[i]) + (1-w)*float64(cf[i]))
				}
			}
			copy(o[keep+overlap*frame:], cur[overlap*frame:])
		}
	}
	return out, nil
}

// linspace returns n evenly spaced values from start to end inclusive, as torch.linspace (the
// first half counted from start, the second from end).
func linspace(start, end float64, n int) []float64 {
	out := make([]float64, n)
	if n == 1 {
		out[0] = start
		return out
	}
	step := (end - start) / float64(n-1)
	for i := range out {
		if i < n/2 {
			out[i] = start + step*float64(i)
		} else {
			out[i] = end - step*float64(n-1-i)
		}
	}
	return out
}

// pixelToUint8 is FramePack's conversion for saved frames: clamp to [-1, 1], ×127.5 + 127.5 in
// float32, truncated toward zero. NaN becomes 0.
func pixelToUint8(x float32) uint8 {
	if x != x {
		return 0
	}
	if x < -1 {
		x = -1
	} else if x > 1 {
		x = 1
	}
	v := float32(x*127.5) + 127.5
	return uint8(v)
}

// PixelsToUint8 converts a [-1, 1] tensor element by element as FramePack's save_bcthw_as_mp4
// does before writing (clamp, ×127.5 + 127.5, truncation), keeping the [B, C, T, H, W] layout.
func PixelsToUint8(v Video) ([]uint8, error) {
	if err := v.check("pixels to uint8"); err != nil {
		return nil, err
	}
	out := make([]uint8, len(v.Data))
	for i, x := range v.Data {
		out[i] = pixelToUint8(x)
	}
	return out, nil
}

// Frames is a uint8 video in the layout handed to the MP4 encoder: [T, H, W, C].
type Frames struct {
	T, H, W, C int
	Pix        []uint8
}

// VideoFrames is save_bcthw_as_mp4's frame tensor: the uint8 conversion of PixelsToUint8 and the
// rearrangement '(m n) c t h w -> t (m h) (n w) c', with n (videos per row) the first of 6, 5, 4,
// 3, 2 that divides B, else B. For the usual B = 1 that is simply [T, H, W, C].
func VideoFrames(v Video) (Frames, error) {
	if err := v.check("video frames"); err != nil {
		return Frames{}, err
	}
	perRow := v.B
	for _, p := range []int{6, 5, 4, 3, 2} {
		if v.B%p == 0 {
			perRow = p
			break
		}
	}
	rows := v.B / perRow
	f := Frames{T: v.T, H: rows * v.H, W: perRow * v.W, C: v.C}
	f.Pix = make([]uint8, f.T*f.H*f.W*f.C)
	for b := 0; b < v.B; b++ {
		m, n := b/perRow, b%perRow
		for c := 0; c < v.C; c++ {
			for t := 0; t < v.T; t++ {
				src := v.Data[(((b*v.C+c)*v.T)+t)*v.H*v.W:][:v.H*v.W]
				for y := 0; y < v.H; y++ {
					row := f.Pix[((t*f.H+m*v.H+y)*f.W+n*v.W)*f.C:]
					for x := 0; x < v.W; x++ {
						row[x*f.C+c] = pixelToUint8(src[y*v.W+x])
					}
				}
			}
		}
	}
	return f, nil
}

// ImageToVideo returns m as a [1, 3, 1, H, W] tensor with v/127.5 − 1, FramePack's
// `torch.from_numpy(input_image_np).float() / 127.5 - 1` permuted to BCTHW.
func ImageToVideo(m *Image) Video {
	v := Video{B: 1, C: 3, T: 1, H: m.Height, W: m.Width}
	v.Data = make([]float32, 3*m.Width*m.Height)
	n := m.Width * m.Height
	for i := 0; i < n; i++ {
		for c := 0; c < 3; c++ {
			v.Data[c*n+i] = float32(m.Pix[i*3+c])/127.5 - 1
		}
	}
	return v
}
