// Package metrics is framepackd's Prometheus metrics, served at /metrics by supervisor/httpapi.
//
// Most of them come from the job event hub (Observe is its observer): stage durations, sampling
// steps, retries and faults, convolution fallbacks, finished jobs. Job counts by state and the
// devices' memory and lane health are read when scraped. Worker spawns and exits and the
// convolution tiers' counts come from the pipeline's per-stage records (ObserveStage).
//
// Labels are bounded: stage, backend, lane, model, state, class and tier take a handful of
// values each; no job id, path or message is ever a label.
package metrics

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// Namespace prefixes every metric.
const Namespace = "framepack"

// scrapeTimeout bounds the Jobs and Devices calls of one scrape.
const scrapeTimeout = 5 * time.Second

// Config holds what the scrape-time metrics read.
type Config struct {
	// Jobs counts the stored jobs by state; nil leaves out framepack_jobs and
	// framepack_queue_depth.
	Jobs func() (map[framepackv1.JobState]int, error)
	// Devices lists the devices and whether the server serves (DeviceService.ListDevices);
	// nil leaves out the device metrics and framepack_serving.
	Devices func(ctx context.Context) (*framepackv1.ListDevicesResponse, error)
	// Log receives scrape errors; nil discards them.
	Log logrus.FieldLogger
}

// StageRecord is what ObserveStage needs of one finished stage (pipeline.StageRecord).
type StageRecord struct {
	// Lane is the lane the stage ran on ("cuda:0", "cpu").
	Lane string
	// Worker is the model worker ("vae", "transformer"); empty for supervisor-side stages.
	Worker string
	// Reused says no worker was spawned (a resident worker ran it).
	Reused bool
	// Kept says the worker stays alive after the stage.
	Kept bool
	// Err is the stage's error, empty on success.
	Err string
	// ConvTiers are the worker's convolution tier counts.
	ConvTiers []ConvTier
}

// ConvTier is one tier's convolution counts of a stage (workerkit.ConvTierStats).
type ConvTier struct {
	// Tier is the tier's name: vendor_tuned, vendor_default, own_kernel, cpu.
	Tier string
	// Attempts, Successes, Failures and SkippedAsHung count the tier's decisions.
	Attempts, Successes, Failures, SkippedAsHung uint64
	// Time is the time spent in the tier (for vendor_tuned: Find and the tuned convolutions).
	Time time.Duration
}

// Metrics is the daemon's metrics registry.
type Metrics struct {
	cfg Config
	log logrus.FieldLogger
	reg *prometheus.Registry

	stageSeconds  *prometheus.HistogramVec
	loadSeconds   *prometheus.HistogramVec
	stepSeconds   *prometheus.HistogramVec
	jobsEnded     *prometheus.CounterVec
	retries       *prometheus.CounterVec
	faults        *prometheus.CounterVec
	giveUps       *prometheus.CounterVec
	fallbacks     *prometheus.CounterVec
	spawns        *prometheus.CounterVec
	exits         *prometheus.CounterVec
	convDecisions *prometheus.CounterVec
	convSeconds   *prometheus.CounterVec
	events        *prometheus.CounterVec

	// devMu protects devs and devTime, the last device list and when it was taken.
	devMu   sync.Mutex
	devs    *framepackv1.ListDevicesResponse
	devTime time.Time

	// mu protects lanes: the lane each running job's stages run on, so that stage durations
	// carry a backend (StageFinished names none). Entries go at the job's terminal event.
	mu    sync.Mutex
	lanes map[string]string
}

// New returns the metrics, registered with a fresh registry together with the Go runtime's and
// the process's collectors.
func New(cfg Config) *Metrics {
	log := cfg.Log
	if log == nil {
		l := logrus.New()
		l.SetOutput(nopWriter{})
		log = l
	}
	durations := []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}
	m := &Metrics{cfg: cfg, log: log, reg: prometheus.NewRegistry(), lanes: map[string]string{}}
	m.stageSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "stage_duration_seconds",
		Help: "Wall time of finished stages, worker start to exit, by stage and backend.", Buckets: durations}, []string{"stage", "backend"})
	m.loadSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "stage_load_seconds",
		Help: "Model load time of finished worker stages, by stage and backend.", Buckets: durations}, []string{"stage", "backend"})
	m.stepSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "sampling_step_seconds",
		Help:    "Time of one sampling step of the transformer, by backend.",
		Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60}}, []string{"backend"})
	m.jobsEnded = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "jobs_ended_total",
		Help: "Jobs that reached a final state, by state."}, []string{"state"})
	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "stage_retries_total",
		Help: "Stage attempts that failed and were tried again, by stage and fault class."}, []string{"stage", "class"})
	m.faults = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "faults_total",
		Help: "Failed stage attempts, retried or final, by fault class."}, []string{"class"})
	m.giveUps = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "give_ups_total",
		Help: "Jobs that failed for good, by the stage that failed."}, []string{"stage"})
	m.fallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "conv_fallbacks_total",
		Help: "Convolutions that left a tier of the fallback chain, by the tier left and the tier used next."}, []string{"from", "to"})
	m.spawns = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "worker_spawns_total",
		Help: "Worker processes started, by model."}, []string{"model"})
	m.exits = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "worker_exits_total",
		Help: "Worker processes ended after a stage, by model and reason (done: the stage succeeded; failed: it did not)."}, []string{"model", "reason"})
	m.convDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "conv_decisions_total",
		Help: "Convolution calls by tier and outcome (success, failure, skipped_hung), as the workers report them."}, []string{"tier", "outcome"})
	m.convSeconds = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "conv_seconds_total",
		Help: "Time spent in each convolution tier; vendor_tuned includes MIOpen Find / cuDNN FindEx."}, []string{"tier"})
	m.events = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "job_events_total",
		Help: "Job events published, by kind."}, []string{"kind"})
	m.reg.MustRegister(m.stageSeconds, m.loadSeconds, m.stepSeconds, m.jobsEnded, m.retries, m.faults, m.giveUps,
		m.fallbacks, m.spawns, m.exits, m.convDecisions, m.convSeconds, m.events,
		&scrapeCollector{m: m},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Series that exist from the start at 0, so rate() and alerts see them before the first one.
	for c := framepackv1.AttemptClass_ATTEMPT_CLASS_OOM; c <= framepackv1.AttemptClass_ATTEMPT_CLASS_BAD_INPUT; c++ {
		m.faults.WithLabelValues(ClassName(c))
	}
	for _, st := range []string{"succeeded", "failed", "cancelled"} {
		m.jobsEnded.WithLabelValues(st)
	}
	return m
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }

// Registry returns the registry (for tests and extra collectors).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: logAdapter{m.log}, ErrorHandling: promhttp.ContinueOnError})
}

type logAdapter struct{ l logrus.FieldLogger }

func (a logAdapter) Println(v ...any) { a.l.Warn(v...) }

// Observe counts one published job event; it is the event hub's observer and never blocks.
func (m *Metrics) Observe(ev *framepackv1.JobEvent) {
	if ev == nil {
		return
	}
	id := ev.GetJobId()
	switch e := ev.GetEvent().(type) {
	case *framepackv1.JobEvent_StageStarted:
		m.events.WithLabelValues("stage_started").Inc()
		m.mu.Lock()
		m.lanes[id] = e.StageStarted.GetLane()
		m.mu.Unlock()
	case *framepackv1.JobEvent_StageFinished:
		m.events.WithLabelValues("stage_finished").Inc()
		f := e.StageFinished
		backend := m.backendOf(id)
		stage := StageName(f.GetStage())
		m.stageSeconds.WithLabelValues(stage, backend).Observe(f.GetDuration().AsDuration().Seconds())
		if ld := f.GetLoadDuration().AsDuration(); ld > 0 {
			m.loadSeconds.WithLabelValues(stage, backend).Observe(ld.Seconds())
		}
	case *framepackv1.JobEvent_SamplingStep:
		m.events.WithLabelValues("sampling_step").Inc()
		m.stepSeconds.WithLabelValues(m.backendOf(id)).Observe(e.SamplingStep.GetStepDuration().AsDuration().Seconds())
	case *framepackv1.JobEvent_Preview:
		m.events.WithLabelValues("preview").Inc()
	case *framepackv1.JobEvent_SectionVideo:
		m.events.WithLabelValues("section_video").Inc()
	case *framepackv1.JobEvent_MemoryTelemetry:
		m.events.WithLabelValues("memory_telemetry").Inc()
	case *framepackv1.JobEvent_Fallback:
		m.events.WithLabelValues("fallback").Inc()
		m.fallbacks.WithLabelValues(TierName(e.Fallback.GetFromTier()), TierName(e.Fallback.GetToTier())).Inc()
	case *framepackv1.JobEvent_Retry:
		m.events.WithLabelValues("retry").Inc()
		a := e.Retry.GetAttempt()
		class := ClassName(a.GetClass())
		m.retries.WithLabelValues(StageName(a.GetStage()), class).Inc()
		m.faults.WithLabelValues(class).Inc()
	case *framepackv1.JobEvent_JobFinished:
		m.events.WithLabelValues("job_finished").Inc()
		m.jobsEnded.WithLabelValues("succeeded").Inc()
		m.forget(id)
	case *framepackv1.JobEvent_JobFailed:
		m.events.WithLabelValues("job_failed").Inc()
		m.jobsEnded.WithLabelValues("failed").Inc()
		f := e.JobFailed.GetFailure()
		m.giveUps.WithLabelValues(StageName(f.GetStage())).Inc()
		if at := f.GetAttempts(); len(at) > 0 {
			if c := at[len(at)-1].GetClass(); c != framepackv1.AttemptClass_ATTEMPT_CLASS_OK && c != framepackv1.AttemptClass_ATTEMPT_CLASS_UNSPECIFIED {
				m.faults.WithLabelValues(ClassName(c)).Inc()
			}
		}
		m.forget(id)
	case *framepackv1.JobEvent_JobCancelled:
		m.events.WithLabelValues("job_cancelled").Inc()
		m.jobsEnded.WithLabelValues("cancelled").Inc()
		m.forget(id)
	}
}

func (m *Metrics) backendOf(id string) string {
	m.mu.Lock()
	lane := m.lanes[id]
	m.mu.Unlock()
	if lane == "" {
		return "unknown"
	}
	b, _, _ := strings.Cut(lane, ":")
	return b
}

func (m *Metrics) forget(id string) {
	m.mu.Lock()
	delete(m.lanes, id)
	m.mu.Unlock()
}

// ObserveStage counts one stage's worker spawn and exit and its convolution tiers.
func (m *Metrics) ObserveStage(rec StageRecord) {
	if rec.Worker == "" {
		return
	}
	if !rec.Reused {
		m.spawns.WithLabelValues(rec.Worker).Inc()
	}
	switch {
	case rec.Err != "":
		m.exits.WithLabelValues(rec.Worker, "failed").Inc()
	case !rec.Kept:
		m.exits.WithLabelValues(rec.Worker, "done").Inc()
	}
	for _, t := range rec.ConvTiers {
		if t.Tier == "" {
			continue
		}
		m.convDecisions.WithLabelValues(t.Tier, "success").Add(float64(t.Successes))
		m.convDecisions.WithLabelValues(t.Tier, "failure").Add(float64(t.Failures))
		m.convDecisions.WithLabelValues(t.Tier, "skipped_hung").Add(float64(t.SkippedAsHung))
		m.convSeconds.WithLabelValues(t.Tier).Add(t.Time.Seconds())
	}
}

// StageName is a stage's label value: "text_encode", "transformer", ...
func StageName(s framepackv1.Stage) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "STAGE_"))
}

// TierName is a conv tier's label value: "vendor_tuned", ..., "cpu".
func TierName(t framepackv1.ConvTier) string {
	return strings.ToLower(strings.TrimPrefix(t.String(), "CONV_TIER_"))
}

// ClassName is a fault class's label value: "oom", "hang", "crash", ...
func ClassName(c framepackv1.AttemptClass) string {
	return strings.ToLower(strings.TrimPrefix(c.String(), "ATTEMPT_CLASS_"))
}

// deviceMaxAge is how long a device list is reused: listing devices may start a probe
// process, which a scrape every few seconds should not do each time.
const deviceMaxAge = 10 * time.Second

// devices returns the device list, at most deviceMaxAge old.
func (m *Metrics) devices() (*framepackv1.ListDevicesResponse, error) {
	m.devMu.Lock()
	defer m.devMu.Unlock()
	if m.devs != nil && time.Since(m.devTime) < deviceMaxAge {
		return m.devs, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	devs, err := m.cfg.Devices(ctx)
	if err != nil {
		return nil, err
	}
	m.devs, m.devTime = devs, time.Now()
	return devs, nil
}

// scrapeCollector reads the job counts and devices at scrape time.
type scrapeCollector struct{ m *Metrics }

var (
	jobsDesc  = prometheus.NewDesc(Namespace+"_jobs", "Jobs in the store, by state.", []string{"state"}, nil)
	queueDesc = prometheus.NewDesc(Namespace+"_queue_depth", "Jobs waiting for a lane.", nil, nil)
	usedDesc  = prometheus.NewDesc(Namespace+"_device_memory_used_bytes", "Device memory in use, as the driver reports it, by lane.", []string{"lane", "backend"}, nil)
	totalDesc = prometheus.NewDesc(Namespace+"_device_memory_total_bytes", "Device memory size, by lane.", []string{"lane", "backend"}, nil)
	stateDesc = prometheus.NewDesc(Namespace+"_lane_state", "1 for the lane's current state (healthy, degraded, held, not_serving), 0 for the others.", []string{"lane", "state"}, nil)
	servDesc  = prometheus.NewDesc(Namespace+"_serving", "1 while the server runs jobs (gRPC health SERVING), 0 while it does not: framepack health and framepack devices say why.", nil, nil)
	busyDesc  = prometheus.NewDesc(Namespace+"_lane_busy", "1 while the lane runs a job.", []string{"lane"}, nil)
)

// laneStates are the lane_state label values, every one exported for every lane.
var laneStates = []framepackv1.LaneState{framepackv1.LaneState_LANE_STATE_HEALTHY, framepackv1.LaneState_LANE_STATE_DEGRADED,
	framepackv1.LaneState_LANE_STATE_HELD, framepackv1.LaneState_LANE_STATE_NOT_SERVING}

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{jobsDesc, queueDesc, usedDesc, totalDesc, stateDesc, busyDesc, servDesc} {
		ch <- d
	}
}

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	if m.cfg.Jobs != nil {
		counts, err := m.cfg.Jobs()
		if err != nil {
			m.log.WithError(err).Warn("metrics: count jobs")
			ch <- prometheus.NewInvalidMetric(jobsDesc, err)
		} else {
			for v, name := range framepackv1.JobState_name {
				st := framepackv1.JobState(v)
				if st == framepackv1.JobState_JOB_STATE_UNSPECIFIED {
					continue
				}
				ch <- prometheus.MustNewConstMetric(jobsDesc, prometheus.GaugeValue, float64(counts[st]), strings.ToLower(strings.TrimPrefix(name, "JOB_STATE_")))
			}
			ch <- prometheus.MustNewConstMetric(queueDesc, prometheus.GaugeValue, float64(counts[framepackv1.JobState_JOB_STATE_QUEUED]))
		}
	}
	if m.cfg.Devices != nil {
		resp, err := m.devices()
		if err != nil {
			m.log.WithError(err).Warn("metrics: list devices")
			ch <- prometheus.NewInvalidMetric(usedDesc, err)
			return
		}
		serving := 1.0
		if resp.GetNotServingReason() != "" {
			serving = 0
		}
		ch <- prometheus.MustNewConstMetric(servDesc, prometheus.GaugeValue, serving)
		for _, d := range resp.GetDevices() {
			lane := d.GetLane()
			ch <- prometheus.MustNewConstMetric(usedDesc, prometheus.GaugeValue, float64(d.GetUsedMemoryBytes()), lane, d.GetBackend())
			ch <- prometheus.MustNewConstMetric(totalDesc, prometheus.GaugeValue, float64(d.GetTotalMemoryBytes()), lane, d.GetBackend())
			for _, s := range laneStates {
				v := 0.0
				if d.GetLaneState() == s {
					v = 1
				}
				ch <- prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, v, lane, strings.ToLower(strings.TrimPrefix(s.String(), "LANE_STATE_")))
			}
			busy := 0.0
			if d.GetCurrentJobId() != "" {
				busy = 1
			}
			ch <- prometheus.MustNewConstMetric(busyDesc, prometheus.GaugeValue, busy, lane)
		}
	}
}
