package runtime

import "sync"

// Scope collects tensors to free together: intermediates of a forward pass. The zero value is
// ready to use; it is safe for concurrent use.
//
//	var sc Scope
//	defer sc.Free()
//	h, err := sc.Track(rt.SiLU(x))
type Scope struct {
	// mu protects ts.
	mu sync.Mutex
	ts []*Tensor
}

// Track adds t to the scope and passes (t, err) through, so an op's result can be wrapped
// directly: sc.Track(rt.Add(a, b)).
func (s *Scope) Track(t *Tensor, err error) (*Tensor, error) {
	if t != nil {
		s.Add(t)
	}
	return t, err
}

// Add adds tensors to the scope.
func (s *Scope) Add(ts ...*Tensor) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range ts {
		if t != nil {
			s.ts = append(s.ts, t)
		}
	}
}

// Keep removes t from the scope so Free leaves it alive (a result to return), and returns t.
func (s *Scope) Keep(t *Tensor) *Tensor {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.ts) - 1; i >= 0; i-- {
		if s.ts[i] == t {
			s.ts = append(s.ts[:i], s.ts[i+1:]...)
		}
	}
	return t
}

// Free frees every tensor of the scope and empties it.
func (s *Scope) Free() {
	s.mu.Lock()
	ts := s.ts
	s.ts = nil
	s.mu.Unlock()
	for i := len(ts) - 1; i >= 0; i-- {
		ts[i].Free()
	}
}

// Len returns the number of tensors in the scope.
func (s *Scope) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ts)
}
