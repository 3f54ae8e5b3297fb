package nn

import (
	"context"
	"fmt"

	"github.com/framepackd/framepackd/internal/runtime"
)

// Pass is how every forward is written: a chain of runtime ops with a sticky error. Do records
// an op's result; after the first error later ops see nil inputs and are skipped (Do frees what
// they made), so a forward reads as its shape comments and checks Err once. Every result is
// freed when the pass is (Free) unless handed out with Keep; Drop frees an intermediate early
// to bound the peak.
//
//	p := nn.NewPass(ctx, rt)
//	defer p.Free()
//	h := lin.Forward(p, x)      // [B, L, out]
//	y := p.Do(rt.SiLU(h))
//	if err := p.Err(); err != nil { … }
//	return p.Keep(y), nil
type Pass struct {
	// RT is the runtime the ops run on.
	RT  *runtime.Runtime
	ctx context.Context
	sc  runtime.Scope
	err error
}

// NewPass starts a pass on rt; ctx (nil means none) is checked by Check between blocks, so a
// cancelled stage stops at the next block.
func NewPass(ctx context.Context, rt *runtime.Runtime) *Pass {
	if ctx == nil {
		ctx = context.Background()
	}
	return &Pass{RT: rt, ctx: ctx}
}

// Context returns the pass's context.
func (p *Pass) Context() context.Context { return p.ctx }

// Err returns the first error of the pass, or nil.
func (p *Pass) Err() error { return p.err }

// OK reports whether no op failed so far.
func (p *Pass) OK() bool { return p.err == nil }

// Do records an op's result: the tensor is tracked for Free; an error is kept.
func (p *Pass) Do(t *runtime.Tensor, err error) *runtime.Tensor {
	if p.err != nil || err != nil {
		if p.err == nil {
			p.err = err
		}
		t.Free()
		return nil
	}
	p.sc.Add(t)
	return t
}

// Fail records err (if none is recorded yet).
func (p *Pass) Fail(err error) {
	if p.err == nil && err != nil {
		p.err = err
	}
}

// Failf records an error made from format (if none is recorded yet).
func (p *Pass) Failf(format string, args ...any) { p.Fail(fmt.Errorf(format, args...)) }

// Check records the context's error (a cancelled stage) and reports whether the pass is still
// fine.
func (p *Pass) Check() bool {
	if p.err == nil {
		if err := p.ctx.Err(); err != nil {
			p.err = fmt.Errorf("forward: %w", err)
		}
	}
	return p.err == nil
}

// Keep takes t out of the pass: the caller owns it. It returns nil after an error.
func (p *Pass) Keep(t *runtime.Tensor) *runtime.Tensor {
	if t == nil || p.err != nil {
		return nil
	}
	return p.sc.Keep(t)
}

// Drop frees intermediates early (Free is a no-op for them later).
func (p *Pass) Drop(ts ...*runtime.Tensor) {
	for _, t := range ts {
		t.Free()
	}
}

// Free frees every tensor of the pass not handed out with Keep.
func (p *Pass) Free() { p.sc.Free() }

// Reshape returns x with a new shape and frees x's handle (x must belong to the pass): the
// storage then lives exactly as long as the new handle.
func (p *Pass) Reshape(x *runtime.Tensor, shape ...int) *runtime.Tensor {
	if p.err != nil {
		return nil
	}
	out := p.Do(x.Reshape(shape...))
	p.Drop(x)
	return out
}

// Chunk splits the last dim of x into n equal parts (torch.chunk).
func (p *Pass) Chunk(x *runtime.Tensor, n int) []*runtime.Tensor {
	out := make([]*runtime.Tensor, n)
	if p.err != nil {
		return out
	}
	w := x.Dim(-1) / n
	for i := range out {
		out[i] = p.Do(p.RT.Slice(x, -1, i*w, (i+1)*w))
	}
	return out
}

// Sub runs f in a child pass whose intermediates are freed when it returns: a block's
// activations live only as long as the block. f's result moves into p; an error of f (prefixed
// with name when not empty) becomes p's.
func (p *Pass) Sub(name string, f func(q *Pass) *runtime.Tensor) *runtime.Tensor {
	if p.err != nil {
		return nil
	}
	q := &Pass{RT: p.RT, ctx: p.ctx}
	defer q.Free()
	out := q.Keep(f(q))
	if q.err != nil {
		if name != "" {
			p.err = fmt.Errorf("%s: %w", name, q.err)
		} else {
			p.err = q.err
		}
		return nil
	}
	return p.Do(out, nil)
}

// Then applies f to x and drops x: one step of a chain that holds at most two activations
// (x must belong to the pass).
func (p *Pass) Then(x *runtime.Tensor, f func(x *runtime.Tensor) *runtime.Tensor) *runtime.Tensor {
	if p.err != nil {
		return nil
	}
	out := f(x)
	if out != x {
		p.Drop(x)
	}
	return out
}
