package main

import (
	"bufio"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

func laneIndex(lane string) string {
	_, idx, ok := strings.Cut(lane, ":")
	if !ok {
		return "0"
	}
	return idx
}

// nvidiaSMI reads one memory figure (MiB) of GPU idx.
func nvidiaSMI(idx, field string) (int64, error) {
	out, err := exec.Command("nvidia-smi", "--query-gpu="+field, "--format=csv,noheader,nounits", "-i", idx).Output()
	if err != nil {
		return 0, fmt.Errorf("nvidia-smi %s: %w", field, err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("nvidia-smi %s: %q: %w", field, out, err)
	}
	return v, nil
}

// sampler follows the GPU's used memory through nvidia-smi's loop mode (every 50 ms).
type sampler struct {
	cmd     *exec.Cmd
	mu      sync.Mutex
	samples []sample
	done    chan struct{}
}

type sample struct {
	at  time.Time
	mib float64
}

func startSampler(idx string) *sampler {
	s := &sampler{done: make(chan struct{})}
	s.cmd = exec.Command("nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", idx, "-lms", "50")
	out, err := s.cmd.StdoutPipe()
	if err != nil || s.cmd.Start() != nil {
		close(s.done)
		return s
	}
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if v, err := strconv.ParseFloat(strings.TrimSpace(sc.Text()), 64); err == nil {
				s.mu.Lock()
				s.samples = append(s.samples, sample{time.Now(), v})
				s.mu.Unlock()
			}
		}
	}()
	return s
}

// settle waits until a sample is at most mib, or for limit.
func (s *sampler) settle(mib float64, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		n := len(s.samples)
		back := n > 0 && s.samples[n-1].mib <= mib
		s.mu.Unlock()
		if back {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// peakIn is the highest sample (MiB) in [from, to], 0 when none.
func (s *sampler) peakIn(from, to time.Time) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var p float64
	for _, x := range s.samples {
		if !x.at.Before(from) && !x.at.After(to) {
			p = max(p, x.mib)
		}
	}
	return p
}

// backAfter is the time from kill to the first sample at most mib, -1 when none came before
// next (zero: no limit).
func (s *sampler) backAfter(kill, next time.Time, mib float64) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, x := range s.samples {
		if x.at.Before(kill) {
			continue
		}
		if !next.IsZero() && x.at.After(next) {
			break
		}
		if x.mib <= mib {
			return x.at.Sub(kill).Seconds()
		}
	}
	return -1
}

// stop ends the sampling and returns the peak in GiB.
func (s *sampler) stop() float64 {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.done
		_ = s.cmd.Wait()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var p float64
	for _, x := range s.samples {
		p = max(p, x.mib)
	}
	return p / 1024
}
