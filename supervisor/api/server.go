// Package api is framepackd's public gRPC API: framepack.v1 JobService and DeviceService,
// the standard gRPC health service and server reflection, served on a unix socket (mode 0600)
// and optionally on TCP.
//
// Every SubmitJobRequest field is validated before a job is stored; a bad request is answered
// with INVALID_ARGUMENT, a message naming each bad field, and a google.rpc.BadRequest detail
// with one field violation per field. Handlers never panic: a recovery interceptor turns a
// panic into INTERNAL and a log line.
package api

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/devices"
	"github.com/framepackd/framepackd/supervisor/events"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/video"
	"github.com/sirupsen/logrus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Queue is what the API needs of the job queue (jobs.Queue).
type Queue interface {
	Submit(ctx context.Context, spec *framepackv1.JobSpec, image []byte) (*framepackv1.Job, error)
	SubmitOnce(ctx context.Context, req jobs.ClientRequest, spec *framepackv1.JobSpec, image []byte) (*framepackv1.Job, bool, error)
	Cancel(ctx context.Context, id, reason string) (*framepackv1.Job, error)
	Lanes() []string
	Running() map[string]string
}

// Config holds the server's dependencies. The function fields are what tests replace.
type Config struct {
	// Store reads jobs (LocalStore of a jobs.Store on a single host); required.
	Store Store
	// Queue takes and cancels jobs; required.
	Queue Queue
	// Hub streams job events (an *events.Hub on a single host); required.
	Hub Events
	// Devices lists the devices, one per lane (current_job_id is filled in from the queue);
	// nil lists each lane with only its name and backend.
	Devices func(ctx context.Context) ([]*framepackv1.Device, error)
	// Unload kills the kept workers of lane ("": every lane) whose model is in models (empty:
	// every one) and lists them (DeviceService.UnloadModels); nil: no worker is ever kept,
	// nothing to unload.
	Unload func(lane string, models []string) ([]*framepackv1.UnloadedWorker, error)
	// DecodeImage checks a submitted image; nil means a full decode that refuses images over
	// MaxImagePixels from their header.
	DecodeImage func([]byte) (width, height int, err error)
	// MaxImagePixels is the largest image accepted, width × height; 0 means MaxImagePixels.
	MaxImagePixels int64
	// MaxConcurrentDecodes bounds the images decoded at once; 0 means
	// DefaultMaxConcurrentDecodes.
	MaxConcurrentDecodes int
	// DiskBudget is the most bytes the job directories may hold together; a job that would
	// not fit is refused at submit with RESOURCE_EXHAUSTED. 0 means no budget.
	DiskBudget int64
	// MinFreeBytes is the free space a job must leave on the state directory's file system;
	// 0 turns the check off.
	MinFreeBytes int64
	// FreeBytes returns the free bytes of the file system holding dir; nil means statfs.
	FreeBytes func(dir string) (uint64, error)
	// Ready reports why jobs cannot run now (nil when they can); SubmitJob refuses jobs with
	// UNAVAILABLE and the reason while it fails. Nil means always ready.
	Ready func() error
	// CheckVariant says whether jobs of a sampling variant (JobSpec.variant, "" for i2v) can
	// run (pipeline.Runner.CheckVariant); nil accepts only "" and "i2v".
	CheckVariant func(name string) error
	// Admit reports why a job of spec cannot run on this server (its lane has no device);
	// SubmitJob refuses it with FAILED_PRECONDITION and the reason, before decoding the
	// image. Nil admits all. The variant is checked by CheckVariant, as a field of the
	// request (INVALID_ARGUMENT).
	Admit func(spec *framepackv1.JobSpec) error
	// Presets keeps named job settings (PresetService); nil: this server keeps none (a
	// cluster's daemons, for now), and PresetService and JobSpec.preset say so.
	Presets PresetStore
	// Video probes input videos (ffprobe, beside its ffmpeg); nil means ffmpeg and ffprobe from
	// PATH.
	Video *video.Writer
	// VideoLimits bound an input video (frames, seconds, frame pixels); zero means
	// DefaultVideoLimits.
	VideoLimits video.Limits
	// MaxVideoBytes is the largest input video; 0 means DefaultMaxVideoBytes, at most
	// MaxRequestBytes.
	MaxVideoBytes int
	// Models returns what the served models take (models.go): the resolution a job that
	// names none runs at, and the bucket tables they refuse. Nil, or a nil answer (models
	// not usable yet), means FramePack's full-size models: 640, every table.
	Models func() ModelFit
	// Log is the server's logger; nil discards.
	Log logrus.FieldLogger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Server implements framepack.v1 JobService and DeviceService.
type Server struct {
	framepackv1.UnimplementedJobServiceServer
	framepackv1.UnimplementedDeviceServiceServer
	framepackv1.UnimplementedPresetServiceServer
	framepackv1.UnimplementedBatchServiceServer

	cfg       Config
	log       logrus.FieldLogger
	health    *health.Server
	decodeSem chan struct{} // one token per image being decoded (images.go)
	ready     readyState    // what health says and why (ready.go)
}

// New returns a server.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.Queue == nil || cfg.Hub == nil {
		return nil, fmt.Errorf("new api server: Store, Queue and Hub are required")
	}
	if cfg.MaxImagePixels <= 0 {
		cfg.MaxImagePixels = MaxImagePixels
	}
	if cfg.DecodeImage == nil {
		cfg.DecodeImage = decodeLimited(cfg.MaxImagePixels)
	}
	if cfg.MaxConcurrentDecodes <= 0 {
		cfg.MaxConcurrentDecodes = DefaultMaxConcurrentDecodes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Video == nil {
		cfg.Video = &video.Writer{}
	}
	if cfg.VideoLimits == (video.Limits{}) {
		cfg.VideoLimits = DefaultVideoLimits
	}
	switch {
	case cfg.MaxVideoBytes <= 0:
		cfg.MaxVideoBytes = DefaultMaxVideoBytes
	case cfg.MaxVideoBytes > MaxRequestBytes:
		cfg.MaxVideoBytes = MaxRequestBytes
	}
	if cfg.FreeBytes == nil {
		cfg.FreeBytes = FreeBytes
	}
	log := cfg.Log
	if log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		log = l
	}
	return &Server{cfg: cfg, log: log, health: health.NewServer(), decodeSem: make(chan struct{}, cfg.MaxConcurrentDecodes)}, nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// ServiceNames are the services the server registers, as the health service knows them.
var ServiceNames = []string{framepackv1.JobService_ServiceDesc.ServiceName, framepackv1.DeviceService_ServiceDesc.ServiceName,
	framepackv1.PresetService_ServiceDesc.ServiceName, framepackv1.BatchService_ServiceDesc.ServiceName}

// GRPCServer returns a gRPC server with the framepack.v1 services, health and reflection,
// recovery and logging interceptors, and a receive limit that fits the largest image.
func (s *Server) GRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	opts = append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxRecvMsgBytes),
		grpc.ChainUnaryInterceptor(s.unaryInterceptor),
		grpc.ChainStreamInterceptor(s.streamInterceptor),
	}, opts...)
	g := grpc.NewServer(opts...)
	framepackv1.RegisterJobServiceServer(g, s)
	framepackv1.RegisterDeviceServiceServer(g, s)
	framepackv1.RegisterPresetServiceServer(g, s)
	framepackv1.RegisterBatchServiceServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
	reflection.Register(g)
	s.ready.mu.Lock()
	s.setHealth(!s.ready.stopping)
	s.ready.mu.Unlock()
	return g
}

// Shutdown ends the health service's watches (call before grpc.Server.GracefulStop).
func (s *Server) Shutdown() { s.health.Shutdown() }

func (s *Server) recovered(method string, p any) error {
	s.log.WithFields(logrus.Fields{"method": method, "panic": fmt.Sprint(p), "stack": string(debug.Stack())}).Error("rpc handler panicked")
	return status.Errorf(codes.Internal, "internal error in %s (logged by the server)", method)
}

func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			resp, err = nil, s.recovered(info.FullMethod, p)
		}
		s.log.WithFields(logrus.Fields{"method": info.FullMethod, "code": status.Code(err).String(), "duration": time.Since(start)}).Debug("rpc")
	}()
	return handler(ctx, req)
}

func (s *Server) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			err = s.recovered(info.FullMethod, p)
		}
		s.log.WithFields(logrus.Fields{"method": info.FullMethod, "code": status.Code(err).String(), "duration": time.Since(start)}).Debug("rpc")
	}()
	return handler(srv, ss)
}

// statusOf maps an internal error to a gRPC status.
func statusOf(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, jobs.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, jobs.ErrRequestMismatch):
		// The id names a job made from another request: the client must choose a new id, or
		// send the first request again.
		return status.Error(codes.AlreadyExists, "client_request_id already names a job created from a different image or spec: "+err.Error())
	case errors.Is(err, jobs.ErrStopped), errors.Is(err, events.ErrClosed):
		return status.Error(codes.Unavailable, "server is shutting down: "+err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// jobStatus is statusOf for a call about job id: an unknown job reads "no job <id>".
func jobStatus(err error, id string) error {
	if errors.Is(err, jobs.ErrNotFound) {
		return status.Errorf(codes.NotFound, "no job %q", id)
	}
	return statusOf(err)
}

func requireID(id string) error {
	var v Violations
	if id == "" {
		v.Add("job_id", "required")
	} else if !jobs.ValidID(id) {
		return status.Errorf(codes.NotFound, "no job %q", id)
	}
	return v.Err("request")
}

// SubmitJob validates the request and queues the job.
// With a client_request_id, a repeat of a submission returns the job the first one created
// (in its current state, and before the readiness checks: the job exists whether or not the
// server can run jobs now); a repeat with another image or spec is ALREADY_EXISTS.
func (s *Server) SubmitJob(ctx context.Context, req *framepackv1.SubmitJobRequest) (*framepackv1.SubmitJobResponse, error) {
	var once jobs.ClientRequest
	// The request as sent identifies a repeat (its hash); the preset's settings and a named
	// job's video join the spec for everything after that (presets.go, video.go).
	sent := req.GetSpec()
	req, err := s.withPreset(req)
	if err != nil {
		return nil, err
	}
	if req, err = s.withSourceVideo(req); err != nil {
		return nil, err
	}
	// spec is req's spec with the defaults filled in: withDefaults clones it, end image and
	// all, so it runs once, for the early lookup of a client request id or before the
	// checks that need the defaults.
	var spec *framepackv1.JobSpec
	if id := req.GetClientRequestId(); id != "" {
		var v Violations
		if validateClientRequestID(&v, id); len(v) > 0 {
			return nil, v.Err("SubmitJobRequest")
		}
		// A request without a spec has no job to look up: validateSubmit refuses it below.
		if req.GetSpec() != nil {
			spec = s.withDefaults(req.GetSpec())
			hash, err := jobs.RequestHash(s.withDefaults(sent), req.GetImage())
			if err != nil {
				return nil, statusOf(err)
			}
			once = jobs.ClientRequest{ID: id, Hash: hash}
			job, err := s.cfg.Store.JobForRequest(once)
			if err == nil {
				s.logSubmitted(job, once.ID, false)
				return &framepackv1.SubmitJobResponse{Job: job}, nil
			}
			if !errors.Is(err, jobs.ErrNotFound) {
				return nil, statusOf(err)
			}
		}
	}
	// Cheap refusals first: a server that cannot run the job does not decode its image.
	if reason := s.refreshReady(); reason != "" {
		return nil, notReady(reason)
	}
	if req.GetSpec() != nil {
		if s.cfg.Admit != nil {
			if err := s.cfg.Admit(req.GetSpec()); err != nil {
				return nil, cannotRun(err)
			}
		}
		if spec == nil {
			spec = s.withDefaults(req.GetSpec())
		}
		if err := s.checkFit(spec); err != nil {
			return nil, cannotRun(err)
		}
	}
	v := validateSubmit(req, s.cfg.Queue.Lanes(), s.decoder(ctx))
	checkVariant(&v, req.GetSpec().GetVariant(), s.cfg.CheckVariant)
	if len(v) == 0 {
		s.checkVideo(ctx, &v, req.GetSpec()) // decodes: only once the rest is right
	}
	if err := v.Err("SubmitJobRequest"); err != nil {
		return nil, err
	}
	if err := s.admit(spec, requestBytes(req)); err != nil {
		return nil, err
	}
	var job *framepackv1.Job
	created := true
	if once.ID == "" {
		job, err = s.cfg.Queue.Submit(ctx, spec, req.GetImage())
	} else {
		job, created, err = s.cfg.Queue.SubmitOnce(ctx, once, spec, req.GetImage())
	}
	if err != nil {
		return nil, statusOf(err)
	}
	s.logSubmitted(job, once.ID, created)
	return &framepackv1.SubmitJobResponse{Job: job}, nil
}

// logSubmitted logs a submission: a new job, or (created false) the job a repeat of client
// request id returned.
func (s *Server) logSubmitted(job *framepackv1.Job, requestID string, created bool) {
	log := s.log.WithField("job", job.GetId())
	if requestID != "" {
		log = log.WithField("client_request_id", requestID)
	}
	if !created {
		log.Info("job submitted again: the first submission's job returned")
		return
	}
	log.WithFields(logrus.Fields{"seconds": job.GetSpec().GetTotalSecondLength(), "lane": job.GetSpec().GetLane()}).Info("job submitted")
}

// ReasonNotReady is the ErrorInfo reason of SubmitJob's UNAVAILABLE refusal by a server that
// is up but cannot run jobs now (Config.Ready), so that a client tells it from a lost
// connection, which is worth retrying.
const ReasonNotReady = "NOT_READY"

// ReasonJobNotFinished is the ErrorInfo reason of DeleteJob's FAILED_PRECONDITION refusal of
// a job that is queued or running, so that a client can say how to cancel it.
const ReasonJobNotFinished = "JOB_NOT_FINISHED"

// ErrorDomain is the ErrorInfo domain of the server's errors.
const ErrorDomain = "framepackd"

func notReady(reason string) error {
	return withReason(status.Newf(codes.Unavailable, "the server cannot run jobs now: %s", reason), ReasonNotReady)
}

// withReason is st with an ErrorInfo detail of reason, as an error.
func withReason(st *status.Status, reason string) error {
	withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain})
	if err != nil {
		return st.Err()
	}
	return withInfo.Err()
}

// cannotRun is SubmitJob's refusal of a job this server cannot run (Config.Admit, the served
// models).
func cannotRun(err error) error {
	return status.Errorf(codes.FailedPrecondition, "this job cannot run on this server: %v", err)
}

// GetJob returns one job.
func (s *Server) GetJob(_ context.Context, req *framepackv1.GetJobRequest) (*framepackv1.GetJobResponse, error) {
	if err := requireID(req.GetJobId()); err != nil {
		return nil, err
	}
	job, err := s.cfg.Store.Get(req.GetJobId())
	if err != nil {
		return nil, jobStatus(err, req.GetJobId())
	}
	return &framepackv1.GetJobResponse{Job: job}, nil
}

// ListJobs returns a page of jobs, newest first.
func (s *Server) ListJobs(_ context.Context, req *framepackv1.ListJobsRequest) (*framepackv1.ListJobsResponse, error) {
	var v Violations
	if req.GetPageSize() > jobs.MaxPageSize {
		v.Add("page_size", "must be 0 to %d (0 means %d), got %d", jobs.MaxPageSize, jobs.DefaultPageSize, req.GetPageSize())
	}
	for _, st := range req.GetStates() {
		if _, known := framepackv1.JobState_name[int32(st)]; !known || st == framepackv1.JobState_JOB_STATE_UNSPECIFIED {
			v.Add("states", "unknown job state %d", st)
			break
		}
	}
	if err := v.Err("ListJobsRequest"); err != nil {
		return nil, err
	}
	list, next, err := s.cfg.Store.List(jobs.ListOptions{States: req.GetStates(), PageSize: int(req.GetPageSize()), PageToken: req.GetPageToken()})
	if errors.Is(err, jobs.ErrBadPageToken) {
		v.Add("page_token", "not a token this server gave")
		return nil, v.Err("ListJobsRequest")
	}
	if err != nil {
		return nil, statusOf(err)
	}
	return &framepackv1.ListJobsResponse{Jobs: list, NextPageToken: next}, nil
}

// CancelJob cancels a queued or running job.
func (s *Server) CancelJob(ctx context.Context, req *framepackv1.CancelJobRequest) (*framepackv1.CancelJobResponse, error) {
	if err := requireID(req.GetJobId()); err != nil {
		return nil, err
	}
	var v Violations
	checkReason(&v, req.GetReason())
	if err := v.Err("CancelJobRequest"); err != nil {
		return nil, err
	}
	job, err := s.cfg.Queue.Cancel(ctx, req.GetJobId(), req.GetReason())
	if err != nil {
		return nil, jobStatus(err, req.GetJobId())
	}
	s.log.WithFields(logrus.Fields{"job": job.GetId(), "state": job.GetState().String()}).Info("job cancel requested")
	return &framepackv1.CancelJobResponse{Job: job}, nil
}

func checkReason(v *Violations, r string) {
	switch {
	case len(r) > MaxReasonBytes:
		v.Add("reason", "%d bytes, the limit is %d", len(r), MaxReasonBytes)
	case !utf8Valid(r):
		v.Add("reason", "not valid UTF-8")
	}
}

// WatchJob streams a snapshot, the job's history (each event marked replay, with the time it
// first happened), then its live events, and ends after the terminal event.
func (s *Server) WatchJob(req *framepackv1.WatchJobRequest, stream grpc.ServerStreamingServer[framepackv1.JobEvent]) error {
	id := req.GetJobId()
	if err := requireID(id); err != nil {
		return err
	}
	return s.watchOne(stream.Context(), id, req.GetIncludePreviews(), stream.Send)
}

// watchOne sends job id's snapshot, history and live events to send until the job ends (the
// stream of WatchJob; WatchBatch runs one per job).
func (s *Server) watchOne(ctx context.Context, id string, previews bool, send func(*framepackv1.JobEvent) error) error {
	history, sub, err := s.cfg.Hub.Watch(id, events.SubscribeOptions{Previews: previews})
	if err != nil {
		return jobStatus(err, id)
	}
	defer sub.Close()
	// The snapshot is taken after subscribing, so nothing falls between it and the stream.
	job, err := s.cfg.Store.Get(id)
	if err != nil {
		return jobStatus(err, id)
	}
	if err := send(&framepackv1.JobEvent{JobId: id, Time: timestamppb.New(s.cfg.Now()), Event: &framepackv1.JobEvent_Snapshot{Snapshot: job}}); err != nil {
		return err
	}
	for _, ev := range history {
		// Replayed: the stored event, its original time, marked so (a copy: the hub's
		// history is shared).
		ev = proto.Clone(ev).(*framepackv1.JobEvent)
		ev.Replay = true
		if err := send(ev); err != nil {
			return err
		}
		if events.IsTerminal(ev) {
			return nil
		}
	}
	if ev := terminalOf(job, s.cfg.Now()); ev != nil {
		// Ended, but its terminal event is not in the log (yet): say how it ended.
		return send(ev)
	}
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			return statusOf(err)
		}
		if err := send(ev); err != nil {
			return err
		}
		if events.IsTerminal(ev) {
			if n := sub.Dropped(); n > 0 {
				s.log.WithFields(logrus.Fields{"job": id, "dropped": n}).Debug("slow watcher lost events")
			}
			return nil
		}
	}
}

// terminalOf returns the terminal event a finished job's stream ends with, or nil while the
// job has not ended.
func terminalOf(job *framepackv1.Job, now time.Time) *framepackv1.JobEvent {
	ev := &framepackv1.JobEvent{JobId: job.GetId(), Time: timestamppb.New(now)}
	switch job.GetState() {
	case framepackv1.JobState_JOB_STATE_SUCCEEDED:
		ev.Event = &framepackv1.JobEvent_JobFinished{JobFinished: &framepackv1.JobFinished{Result: job.GetResult()}}
	case framepackv1.JobState_JOB_STATE_FAILED:
		ev.Event = &framepackv1.JobEvent_JobFailed{JobFailed: &framepackv1.JobFailed{Failure: job.GetFailure()}}
	case framepackv1.JobState_JOB_STATE_CANCELLED:
		ev.Event = &framepackv1.JobEvent_JobCancelled{JobCancelled: &framepackv1.JobCancelled{}}
	default:
		return nil
	}
	return ev
}

// ListDevices returns the devices, one per lane, with the job each lane runs, and why the
// server does not serve when it does not: its lanes are then NOT_SERVING with that reason
// (unless degraded or held, which say more).
func (s *Server) ListDevices(ctx context.Context, _ *framepackv1.ListDevicesRequest) (*framepackv1.ListDevicesResponse, error) {
	var devs []*framepackv1.Device
	if s.cfg.Devices != nil {
		var err error
		if devs, err = s.cfg.Devices(ctx); err != nil {
			return nil, status.Errorf(codes.Unavailable, "list devices: %v", err)
		}
	} else {
		for _, lane := range s.cfg.Queue.Lanes() {
			devs = append(devs, &framepackv1.Device{Lane: lane, Backend: devices.BackendOf(lane), LaneState: framepackv1.LaneState_LANE_STATE_HEALTHY})
		}
	}
	// Asked after the devices: listing them re-checks the model files (cmd/framepackd).
	reason := s.notServing()
	running := s.cfg.Queue.Running()
	for _, d := range devs {
		d.CurrentJobId = running[d.GetLane()]
		if reason != "" && d.GetLaneState() == framepackv1.LaneState_LANE_STATE_HEALTHY {
			d.LaneState, d.LaneStateReason = framepackv1.LaneState_LANE_STATE_NOT_SERVING, reason
		}
	}
	slices.SortFunc(devs, func(a, b *framepackv1.Device) int { return devices.CompareNames(a.GetLane(), b.GetLane()) })
	return &framepackv1.ListDevicesResponse{Devices: devs, NotServingReason: reason}, nil
}

// workerModels are the model workers UnloadModels can name.
var workerModels = []string{"textenc", "vae", "clipvision", "transformer"}

// UnloadModels kills the model workers the lanes keep alive between jobs.
func (s *Server) UnloadModels(_ context.Context, req *framepackv1.UnloadModelsRequest) (*framepackv1.UnloadModelsResponse, error) {
	var v Violations
	if l := req.GetLane(); l != "" && !slices.Contains(s.cfg.Queue.Lanes(), l) {
		v.Add("lane", "no lane %q; the lanes are %s", l, strings.Join(s.cfg.Queue.Lanes(), ", "))
	}
	for i, m := range req.GetModels() {
		if !slices.Contains(workerModels, m) {
			v.Add(fmt.Sprintf("models[%d]", i), "unknown model %q (want %s)", m, strings.Join(workerModels, ", "))
		}
	}
	if err := v.Err("UnloadModelsRequest"); err != nil {
		return nil, err
	}
	if s.cfg.Unload == nil {
		return &framepackv1.UnloadModelsResponse{}, nil
	}
	out, err := s.cfg.Unload(req.GetLane(), req.GetModels())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "unload models: %v", err)
	}
	return &framepackv1.UnloadModelsResponse{Unloaded: out}, nil
}
