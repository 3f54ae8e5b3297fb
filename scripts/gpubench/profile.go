package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/framepackd/framepackd/internal/runtime"
)

// profile is where one run of a stage spends its time, per op (runtime.Profile: a stream sync
// after every op, so each op's time is its launch plus its device work).
type profile struct {
	Stage    string       `json:"stage"`
	Device   string       `json:"device"`
	TotalMS  float64      `json:"total_ms"` // sum over ops (more than the unprofiled run)
	WallMS   float64      `json:"wall_ms"`  // the profiled run, start to end
	Ops      []profileRow `json:"ops"`      // by op name
	ByShape  []profileRow `json:"by_shape"` // by op name, output dtype and shape
	Failures int          `json:"failures,omitempty"`
	// AttentionServed counts the attentions of the profiled run per tier that served them.
	AttentionServed map[string]uint64 `json:"attention_served,omitempty"`
}

type profileRow struct {
	Op    string  `json:"op"`
	DType string  `json:"dtype,omitempty"`
	Shape string  `json:"shape,omitempty"`
	Calls int     `json:"calls"`
	MS    float64 `json:"total_ms"`
	Share float64 `json:"share"`
}

// run is timed's stand-in under -profile: one warm run, then one run under runtime.Profile.
func (p *profile) run(rt *runtime.Runtime, res *result, warm, _ int, fn func() error) error {
	p.Device = rt.Backend().DeviceName
	for range min(warm, 1) {
		if err := fn(); err != nil {
			return err
		}
	}
	byOp := map[string]*profileRow{}
	byShape := map[string]*profileRow{}
	add := func(m map[string]*profileRow, key string, r profileRow, d time.Duration) {
		e := m[key]
		if e == nil {
			e = &r
			m[key] = e
		}
		e.Calls++
		e.MS += d.Seconds() * 1e3
	}
	before := rt.AttentionStats()
	t0 := time.Now()
	err := rt.Profile(fn, func(o runtime.OpTime) {
		if o.Err != nil {
			p.Failures++
		}
		name := o.Op
		if o.Op == "conv3d" {
			name += " " + o.Tier.String()
		}
		p.TotalMS += o.Duration.Seconds() * 1e3
		add(byOp, name, profileRow{Op: name}, o.Duration)
		shape := shapeClass(o.Shape)
		dt := ""
		if o.Shape != nil {
			dt = o.DType.String()
		}
		add(byShape, name+"|"+dt+"|"+shape, profileRow{Op: name, DType: dt, Shape: shape}, o.Duration)
	})
	if err != nil {
		return err
	}
	if err := rt.Synchronize(); err != nil {
		return err
	}
	p.WallMS = time.Since(t0).Seconds() * 1e3
	after := rt.AttentionStats()
	for i := range after.Served {
		if n := after.Served[i] - before.Served[i]; n > 0 {
			if p.AttentionServed == nil {
				p.AttentionServed = map[string]uint64{}
			}
			p.AttentionServed[runtime.AttentionTier(i).String()] = n
		}
	}
	res.Seconds = p.WallMS / 1e3
	p.Ops = rows(byOp, p.TotalMS)
	p.ByShape = rows(byShape, p.TotalMS)
	return nil
}

// shapeClass names a shape ("1x17955x3072").
func shapeClass(s []int) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = strconv.Itoa(d)
	}
	return strings.Join(parts, "x")
}

func rows(m map[string]*profileRow, total float64) []profileRow {
	out := make([]profileRow, 0, len(m))
	for _, r := range m {
		if total > 0 {
			r.Share = r.MS / total
		}
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].MS != out[j].MS {
			return out[i].MS > out[j].MS
		}
		return out[i].Op+out[i].Shape < out[j].Op+out[j].Shape
	})
	return out
}

// write prints the tables (every op; the 25 costliest op shapes) and writes
// profile-<stage>.json into dir.
func (p *profile) write(dir string, w io.Writer) error {
	fmt.Fprintf(w, "profile %s on %s: %.1f ms over ops, %.1f ms wall (a sync after every op); attention served by %v\n",
		p.Stage, p.Device, p.TotalMS, p.WallMS, p.AttentionServed)
	fmt.Fprintf(w, "%-28s %6s %10s %6s\n", "op", "calls", "total ms", "share")
	for _, r := range p.Ops {
		fmt.Fprintf(w, "%-28s %6d %10.2f %5.1f%%\n", r.Op, r.Calls, r.MS, 100*r.Share)
	}
	fmt.Fprintf(w, "\n%-28s %-5s %-22s %6s %10s %6s\n", "op", "dtype", "shape", "calls", "total ms", "share")
	for i, r := range p.ByShape {
		if i == 25 {
			break
		}
		fmt.Fprintf(w, "%-28s %-5s %-22s %6d %10.2f %5.1f%%\n", r.Op, r.DType, r.Shape, r.Calls, r.MS, 100*r.Share)
	}
	out, err := json.MarshalIndent(p, "", " ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, "profile-"+p.Stage+".json")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	return nil
}
