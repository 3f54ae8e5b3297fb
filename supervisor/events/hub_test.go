package events_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/events"
)

var errUnknownJob = errors.New("unknown job")

// memStore is an in-memory stand-in for the job store's event log.
type memStore struct {
	mu   sync.Mutex
	logs map[string]map[uint64]*framepackv1.JobEvent
}

func newMemStore(jobs ...string) *memStore {
	m := &memStore{logs: map[string]map[uint64]*framepackv1.JobEvent{}}
	for _, j := range jobs {
		m.logs[j] = map[uint64]*framepackv1.JobEvent{}
	}
	return m
}

func (m *memStore) persist(id string, seq uint64, ev *framepackv1.JobEvent) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	log, ok := m.logs[id]
	if !ok {
		return errUnknownJob
	}
	if _, dup := log[seq]; dup {
		return fmt.Errorf("seq %d stored twice", seq)
	}
	log[seq] = ev
	return nil
}

func (m *memStore) load(id string) ([]*framepackv1.JobEvent, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	log, ok := m.logs[id]
	if !ok {
		return nil, 0, errUnknownJob
	}
	var out []*framepackv1.JobEvent
	var next uint64
	for seq := uint64(0); seq < uint64(len(log))+1000 && len(out) < len(log); seq++ {
		if ev, ok := log[seq]; ok {
			out = append(out, ev)
			next = seq + 1
		}
	}
	return out, next, nil
}

func (m *memStore) count(id string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.logs[id])
}

func newHub(t *testing.T, m *memStore, buffer int) *events.Hub {
	t.Helper()
	h, err := events.New(events.Config{Persist: m.persist, Load: m.load, WatcherBuffer: buffer})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func stage(id string, s framepackv1.Stage, section uint32) *framepackv1.JobEvent {
	return &framepackv1.JobEvent{JobId: id, Event: &framepackv1.JobEvent_StageStarted{StageStarted: &framepackv1.StageStarted{Stage: s, SectionIndex: section}}}
}

func step(id string, i uint32) *framepackv1.JobEvent {
	return &framepackv1.JobEvent{JobId: id, Event: &framepackv1.JobEvent_SamplingStep{SamplingStep: &framepackv1.SamplingStep{Step: i, TotalSteps: 25}}}
}

func preview(id string, i uint32) *framepackv1.JobEvent {
	return &framepackv1.JobEvent{JobId: id, Event: &framepackv1.JobEvent_Preview{Preview: &framepackv1.Preview{Step: i, Png: []byte{1, 2, 3}}}}
}

func telemetry(id string, used uint64) *framepackv1.JobEvent {
	return &framepackv1.JobEvent{JobId: id, Event: &framepackv1.JobEvent_MemoryTelemetry{MemoryTelemetry: &framepackv1.MemoryTelemetry{DeviceUsedBytes: used}}}
}

func finished(id string) *framepackv1.JobEvent {
	return &framepackv1.JobEvent{JobId: id, Event: &framepackv1.JobEvent_JobFinished{JobFinished: &framepackv1.JobFinished{}}}
}

func mustPublish(t *testing.T, h *events.Hub, evs ...*framepackv1.JobEvent) {
	t.Helper()
	for _, ev := range evs {
		if err := h.Publish(ev); err != nil {
			t.Fatal(err)
		}
	}
}

func next(t *testing.T, s *events.Subscription) *framepackv1.JobEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	ev, err := s.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func TestClassOf(t *testing.T) {
	for _, tc := range []struct {
		ev   *framepackv1.JobEvent
		want events.Class
	}{
		{stage("j", 1, 0), events.Durable},
		{&framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageFinished{}}, events.Durable},
		{&framepackv1.JobEvent{Event: &framepackv1.JobEvent_SectionVideo{}}, events.Durable},
		{&framepackv1.JobEvent{Event: &framepackv1.JobEvent_Fallback{}}, events.Durable},
		{&framepackv1.JobEvent{Event: &framepackv1.JobEvent_Retry{}}, events.Durable},
		{step("j", 1), events.Progress},
		{preview("j", 1), events.Ephemeral},
		{telemetry("j", 1), events.Ephemeral},
		{&framepackv1.JobEvent{Event: &framepackv1.JobEvent_Snapshot{}}, events.Ephemeral},
		{finished("j"), events.Terminal},
		{&framepackv1.JobEvent{Event: &framepackv1.JobEvent_JobFailed{}}, events.Terminal},
		{&framepackv1.JobEvent{Event: &framepackv1.JobEvent_JobCancelled{}}, events.Terminal},
	} {
		if got := events.ClassOf(tc.ev); got != tc.want {
			t.Errorf("%v: class %d, want %d", tc.ev, got, tc.want)
		}
	}
}

func TestLateAttachGetsHistoryThenLive(t *testing.T) {
	m := newMemStore("j")
	h := newHub(t, m, 0)
	mustPublish(t, h, stage("j", framepackv1.Stage_STAGE_TEXT_ENCODE, 0), telemetry("j", 1), step("j", 1), preview("j", 1), telemetry("j", 2), preview("j", 2))

	history, sub, err := h.Subscribe("j", events.SubscribeOptions{Previews: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	// Durable and progress events in order, then only the latest telemetry and preview.
	if len(history) != 4 || history[0].GetStageStarted() == nil || history[1].GetSamplingStep().GetStep() != 1 ||
		history[2].GetMemoryTelemetry().GetDeviceUsedBytes() != 2 || history[3].GetPreview().GetStep() != 2 {
		t.Fatalf("history %v", history)
	}
	noPreviews, sub2, err := h.Subscribe("j", events.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub2.Close()
	if len(noPreviews) != 3 {
		t.Fatalf("history without previews %v", noPreviews)
	}
	if h.Watchers("j") != 2 {
		t.Fatalf("watchers %d", h.Watchers("j"))
	}

	mustPublish(t, h, preview("j", 3), step("j", 2), finished("j"))
	if ev := next(t, sub); ev.GetPreview().GetStep() != 3 {
		t.Fatalf("live %v", ev)
	}
	if ev := next(t, sub); ev.GetSamplingStep().GetStep() != 2 {
		t.Fatalf("live %v", ev)
	}
	if ev := next(t, sub); !events.IsTerminal(ev) {
		t.Fatalf("live %v", ev)
	}
	if ev := next(t, sub2); ev.GetSamplingStep().GetStep() != 2 {
		t.Fatalf("watcher without previews got %v", ev)
	}
	// Persisted: everything but previews and telemetry.
	if n := m.count("j"); n != 4 {
		t.Fatalf("%d events persisted, want 4", n)
	}
	if err := h.Publish(step("j", 3)); err == nil {
		t.Fatal("publish after the terminal event accepted")
	}
}

func TestReplayAfterRestart(t *testing.T) {
	m := newMemStore("j")
	h := newHub(t, m, 0)
	mustPublish(t, h, stage("j", framepackv1.Stage_STAGE_TRANSFORMER, 0), step("j", 1), preview("j", 1))
	h.Close()
	if err := h.Publish(step("j", 2)); !errors.Is(err, events.ErrClosed) {
		t.Fatalf("publish on a closed hub: %v", err)
	}

	h2 := newHub(t, m, 0)
	mustPublish(t, h2, step("j", 2), finished("j"))
	history, sub, err := h2.Subscribe("j", events.SubscribeOptions{Previews: true})
	if err != nil {
		t.Fatal(err)
	}
	sub.Close()
	if len(history) != 4 || history[0].GetStageStarted() == nil || history[2].GetSamplingStep().GetStep() != 2 || !events.IsTerminal(history[3]) {
		t.Fatalf("history after restart %v", history)
	}
	if _, _, err := h2.Subscribe("nope", events.SubscribeOptions{}); !errors.Is(err, errUnknownJob) {
		t.Fatalf("subscribe to unknown job: %v", err)
	}
	if err := h2.Publish(step("nope", 1)); !errors.Is(err, errUnknownJob) {
		t.Fatalf("publish for unknown job: %v", err)
	}
}

func TestSlowWatcherNeverBlocksAndKeepsWhatMatters(t *testing.T) {
	m := newMemStore("j")
	h := newHub(t, m, 16)
	_, sub, err := h.Subscribe("j", events.SubscribeOptions{Previews: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	// The watcher reads nothing while a whole job happens; publishing must not block.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for section := uint32(0); section < 5; section++ {
			mustPublish(t, h, stage("j", framepackv1.Stage_STAGE_TRANSFORMER, section))
			for i := uint32(1); i <= 25; i++ {
				mustPublish(t, h, step("j", i), preview("j", i), telemetry("j", uint64(i)))
			}
			mustPublish(t, h, &framepackv1.JobEvent{JobId: "j", Event: &framepackv1.JobEvent_SectionVideo{SectionVideo: &framepackv1.SectionVideo{SectionIndex: section}}})
		}
		mustPublish(t, h, finished("j"))
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("publisher blocked by a slow watcher")
	}
	var stages, videos, steps int
	var last *framepackv1.JobEvent
	for {
		ev := next(t, sub)
		switch {
		case ev.GetStageStarted() != nil:
			if int(ev.GetStageStarted().GetSectionIndex()) != stages {
				t.Fatalf("stage events out of order at %v", ev)
			}
			stages++
		case ev.GetSectionVideo() != nil:
			videos++
		case ev.GetSamplingStep() != nil:
			steps++
		}
		last = ev
		if events.IsTerminal(ev) {
			break
		}
	}
	if stages != 5 || videos != 5 || !events.IsTerminal(last) {
		t.Fatalf("slow watcher got %d stages, %d videos, last %v", stages, videos, last)
	}
	if sub.Dropped() == 0 || steps == 125 {
		t.Fatalf("nothing dropped for a watcher 16 events deep (%d steps kept)", steps)
	}
	t.Logf("slow watcher: %d of 125 steps kept, %d events dropped", steps, sub.Dropped())
	// The log itself keeps every step.
	history, sub2, err := h.Subscribe("j", events.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sub2.Close()
	if len(history) != 5+125+5+1 {
		t.Fatalf("log has %d events", len(history))
	}
}

func TestSubscriptionEnds(t *testing.T) {
	m := newMemStore("j")
	h := newHub(t, m, 0)
	_, sub, err := h.Subscribe("j", events.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mustPublish(t, h, step("j", 1))
	h.Close()
	// What was queued still comes, then the hub's error.
	if ev := next(t, sub); ev.GetSamplingStep() == nil {
		t.Fatalf("got %v", ev)
	}
	if _, err := sub.Next(t.Context()); !errors.Is(err, events.ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
	if _, _, err := h.Subscribe("j", events.SubscribeOptions{}); !errors.Is(err, events.ErrClosed) {
		t.Fatalf("subscribe on a closed hub: %v", err)
	}

	h2 := newHub(t, m, 0)
	_, sub2, err := h2.Subscribe("j", events.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	if _, err := sub2.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("next with an expired context: %v", err)
	}
	sub2.Close()
	sub2.Close()
	if _, err := sub2.Next(t.Context()); !errors.Is(err, events.ErrUnsubscribed) {
		t.Fatalf("next after close: %v", err)
	}
	if h2.Watchers("j") != 0 {
		t.Fatal("closed subscription still counted")
	}
}

func TestPublishRejects(t *testing.T) {
	h := newHub(t, newMemStore("j"), 0)
	for _, ev := range []*framepackv1.JobEvent{
		{Event: &framepackv1.JobEvent_SamplingStep{}},
		{JobId: "j"},
		{JobId: "j", Event: &framepackv1.JobEvent_Snapshot{Snapshot: &framepackv1.Job{}}},
	} {
		if err := h.Publish(ev); err == nil {
			t.Errorf("published %v", ev)
		}
	}
	if _, err := events.New(events.Config{}); err == nil {
		t.Error("hub without persistence")
	}
}

func TestConcurrentJobs(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	m := newMemStore(ids...)
	h := newHub(t, m, 4)
	var wg sync.WaitGroup
	for _, id := range ids {
		history, sub, err := h.Subscribe(id, events.SubscribeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(history) != 0 {
			t.Fatal("history of a new job")
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := uint32(1); i <= 200; i++ {
				if err := h.Publish(step(id, i)); err != nil {
					t.Error(err)
				}
			}
			if err := h.Publish(finished(id)); err != nil {
				t.Error(err)
			}
		}()
		go func() {
			defer wg.Done()
			defer sub.Close()
			prev := uint32(0)
			for {
				ev, err := sub.Next(t.Context())
				if err != nil {
					t.Error(err)
					return
				}
				if events.IsTerminal(ev) {
					return
				}
				if s := ev.GetSamplingStep().GetStep(); s <= prev {
					t.Errorf("job %s: step %d after %d", id, s, prev)
				} else {
					prev = s
				}
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if n := m.count(id); n != 201 {
			t.Errorf("job %s: %d events persisted", id, n)
		}
	}
}
