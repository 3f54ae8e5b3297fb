package api

import (
	"sync"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// StoppingReason is why a stopping server does not serve (ListDevicesResponse.not_serving_reason).
const StoppingReason = "the server is stopping"

// readyState is what the server's health says and why: Config.Ready's last answer, and
// whether the server is stopping.
type readyState struct {
	mu       sync.Mutex // mu protects the fields below
	checked  bool       // Ready has been asked at least once
	reason   string     // Ready's last error; empty when it passed
	stopping bool
}

// refreshReady asks Config.Ready now and sets health from its answer: NOT_SERVING with the
// reason logged, or SERVING again (only changes are logged; a first check that passes logs
// nothing). It returns Ready's error text, empty when ready. A stopping server stays
// NOT_SERVING whatever Ready says.
func (s *Server) refreshReady() string {
	reason := ""
	if s.cfg.Ready != nil {
		if err := s.cfg.Ready(); err != nil {
			reason = err.Error()
		}
	}
	r := &s.ready
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping || (r.checked && reason == r.reason) {
		return reason
	}
	first := !r.checked
	r.checked, r.reason = true, reason
	if reason != "" {
		s.log.WithField("reason", reason).Warn("not ready: health is NOT_SERVING and jobs are refused")
		s.setHealth(false)
		return reason
	}
	if !first {
		s.log.Info("ready again: health is SERVING")
	}
	s.setHealth(true)
	return ""
}

// notServing returns why the server does not serve now, checking Config.Ready again; empty
// while it serves.
func (s *Server) notServing() string {
	reason := s.refreshReady()
	s.ready.mu.Lock()
	defer s.ready.mu.Unlock()
	if s.ready.stopping {
		return StoppingReason
	}
	return reason
}

// Stopping turns health NOT_SERVING for good: the daemon drains and stops.
func (s *Server) Stopping() {
	s.ready.mu.Lock()
	defer s.ready.mu.Unlock()
	s.ready.stopping = true
	s.setHealth(false)
}

// setHealth sets the health status of the server and of each of its services. The caller
// holds ready.mu, or the server has not started serving.
func (s *Server) setHealth(ok bool) {
	st := healthpb.HealthCheckResponse_SERVING
	if !ok {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	s.health.SetServingStatus("", st)
	for _, name := range ServiceNames {
		s.health.SetServingStatus(name, st)
	}
}
