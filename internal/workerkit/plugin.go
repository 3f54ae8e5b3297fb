package workerkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"sync"

	"github.com/hashicorp/go-plugin"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/framepackd/framepackd/internal/beacon"
	pb "github.com/framepackd/framepackd/proto/gen/go/framepack/worker/v1"
)

// Handshake is the go-plugin handshake shared by the supervisor and every worker. A binary
// started without the cookie refuses to run as a worker.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  1,
	MagicCookieKey:   "FRAMEPACKD_WORKER_COOKIE",
	MagicCookieValue: "9f1c2e7a-framepackd-worker-v1",
}

// PluginName is the one plugin every worker binary serves.
const PluginName = "worker"

// Plugin connects a Worker to go-plugin's gRPC transport: GRPCServer serves Impl in the worker,
// GRPCClient returns a Worker that calls the worker from the supervisor.
type Plugin struct {
	plugin.NetRPCUnsupportedPlugin

	// Impl is the worker implementation (worker side only).
	Impl Worker
	// Beacon is the page the server updates with the phase of each call (worker side; may be nil).
	Beacon *beacon.Writer
	// Name is the worker's name for errors and Log its logger (worker side; Log may be nil).
	Name string
	Log  *logrus.Entry
}

var (
	_ plugin.GRPCPlugin      = (*Plugin)(nil)
	_ pb.WorkerServiceServer = (*grpcServer)(nil)
	_ remote                 = (*grpcClient)(nil)
)

// GRPCServer registers the worker service.
func (p *Plugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	log := p.Log
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	pb.RegisterWorkerServiceServer(s, &grpcServer{impl: p.Impl, beacon: p.Beacon, name: p.Name, log: log})
	return nil
}

// GRPCClient returns the Worker that calls the service over c.
func (p *Plugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &grpcClient{c: pb.NewWorkerServiceClient(c)}, nil
}

// pluginMap is the plugin set of both sides.
func pluginMap(impl Worker) map[string]plugin.Plugin {
	return map[string]plugin.Plugin{PluginName: &Plugin{Impl: impl}}
}

// statusOf turns a worker error into a gRPC status carrying the Error as a detail.
func statusOf(err error) error {
	we := asError(err)
	code := codes.Internal
	switch we.Code {
	case CodeOutOfMemory:
		code = codes.ResourceExhausted
	case CodeDeviceLost:
		code = codes.Unavailable
	case CodeInvalidArgument:
		code = codes.InvalidArgument
	case CodeCancelled:
		code = codes.Canceled
	}
	st := status.New(code, we.Message)
	if d, derr := st.WithDetails(toError(we)); derr == nil {
		st = d
	}
	return st.Err()
}

// errorOf turns a gRPC error back into the worker's *Error when it carries one, or wraps it.
func errorOf(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, d := range st.Details() {
		if e, ok := d.(*pb.Error); ok {
			return fromError(e)
		}
	}
	switch st.Code() {
	case codes.Canceled:
		return fmt.Errorf("%w: %s", context.Canceled, st.Message())
	case codes.DeadlineExceeded:
		return fmt.Errorf("%w: %s", context.DeadlineExceeded, st.Message())
	}
	return err
}

// grpcServer adapts a Worker to the generated service. Besides copying fields it enforces the
// call order (one Load, before any Run) and keeps the beacon's phase.
type grpcServer struct {
	pb.UnimplementedWorkerServiceServer
	impl   Worker
	beacon *beacon.Writer
	name   string
	log    *logrus.Entry

	mu      sync.Mutex // mu protects loading and loaded
	loading bool       // a Load was accepted
	loaded  bool       // it succeeded
}

// recovered turns a panic of the worker's code into a CodeInternal error, logged with its stack,
// so a bug answers the call instead of killing the worker mid-call. Deferred by every handler.
func (s *grpcServer) recovered(call string, err *error) {
	if r := recover(); r != nil {
		s.log.WithFields(logrus.Fields{"call": call, "panic": fmt.Sprint(r)}).Error("panic recovered\n" + string(debug.Stack()))
		*err = Errorf(CodeInternal, "%s: internal error: %v", call, r)
	}
}

// phase sets the beacon's phase for the duration of a call.
func (s *grpcServer) phase(p beacon.Phase) func() {
	s.beacon.SetPhase(p)
	return func() { s.beacon.SetPhase(beacon.PhaseIdle) }
}

// Load serves the one Load of the worker.
func (s *grpcServer) Load(ctx context.Context, req *pb.LoadRequest) (*pb.LoadResponse, error) {
	s.mu.Lock()
	if s.loading {
		s.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "load: this worker has already been loaded")
	}
	s.loading = true
	s.mu.Unlock()
	if s.beacon == nil && req.GetBeaconPath() != "" {
		w, err := beacon.AttachPath(req.GetBeaconPath())
		if err != nil {
			return nil, statusOf(fmt.Errorf("load: %w", err))
		}
		s.beacon = w
	}
	defer s.phase(beacon.PhaseLoading)()
	resp, err := func() (resp *LoadResponse, err error) {
		defer s.recovered("load", &err)
		return s.impl.Load(ctx, fromLoadRequest(req))
	}()
	if err != nil {
		return nil, statusOf(s.withTraits(err))
	}
	s.mu.Lock()
	s.loaded = true
	s.mu.Unlock()
	return toLoadResponse(resp), nil
}

// Run serves a stage: events, then exactly one Result or Error event.
func (s *grpcServer) Run(req *pb.RunRequest, stream pb.WorkerService_RunServer) error {
	s.mu.Lock()
	loaded := s.loaded
	s.mu.Unlock()
	if !loaded {
		return status.Error(codes.FailedPrecondition, "run: the worker has not been loaded")
	}
	r, err := fromRunRequest(req)
	if err != nil {
		return stream.Send(&pb.RunEvent{Event: &pb.RunEvent_Error{Error: toError(asError(err))}})
	}
	defer s.phase(beacon.PhaseRunning)()
	emit := func(e Event) error {
		ev, err := toEvent(e)
		if err != nil {
			return err
		}
		return stream.Send(ev)
	}
	res, err := func() (res *Result, err error) {
		defer s.recovered("run", &err)
		return s.impl.Run(stream.Context(), r, emit)
	}()
	if err != nil {
		return stream.Send(&pb.RunEvent{Event: &pb.RunEvent_Error{Error: toError(asError(err))}})
	}
	if res == nil {
		res = &Result{}
	}
	return stream.Send(&pb.RunEvent{Event: &pb.RunEvent_Result{Result: toResult(res)}})
}

// withTraits adds the model's traits to a Load's out-of-memory error when the worker declares
// them (TraitsDeclarer).
func (s *grpcServer) withTraits(err error) error {
	td, ok := s.impl.(TraitsDeclarer)
	if !ok || CodeOf(err) != CodeOutOfMemory || TraitsOf(err) != nil {
		return err
	}
	we := *asError(err)
	we.Traits = td.Traits()
	return &we
}

// Stats serves the worker's counters.
func (s *grpcServer) Stats(ctx context.Context, _ *pb.StatsRequest) (*pb.StatsResponse, error) {
	st, err := func() (st *Stats, err error) {
		defer s.recovered("stats", &err)
		return s.impl.Stats(ctx)
	}()
	if err != nil {
		return nil, statusOf(err)
	}
	if st == nil {
		st = &Stats{}
	}
	return toStats(st), nil
}

// Probe serves a device probe.
func (s *grpcServer) Probe(ctx context.Context, req *pb.ProbeRequest) (*pb.ProbeResponse, error) {
	pr, ok := s.impl.(Prober)
	if !ok {
		return nil, statusOf(Errorf(CodeInvalidArgument, "probe: the %s worker does not probe devices; the probe worker does", s.name))
	}
	defer s.phase(beacon.PhaseProbing)()
	resp, err := func() (resp *ProbeResponse, err error) {
		defer s.recovered("probe", &err)
		return pr.Probe(ctx, fromProbeRequest(req))
	}()
	if err != nil {
		return nil, statusOf(err)
	}
	return toProbeResponse(resp), nil
}

// Estimate serves a memory estimate (no Load needed; it changes nothing in the worker).
func (s *grpcServer) Estimate(ctx context.Context, req *pb.EstimateRequest) (*pb.EstimateResponse, error) {
	est, ok := s.impl.(Estimator)
	if !ok {
		return nil, status.Errorf(codes.Unimplemented, "estimate: the %s worker does not estimate its memory", s.name)
	}
	resp, err := func() (resp *EstimateResponse, err error) {
		defer s.recovered("estimate", &err)
		return est.Estimate(ctx, fromEstimateRequest(req))
	}()
	if err != nil {
		return nil, statusOf(err)
	}
	return toEstimateResponse(resp), nil
}

// grpcClient adapts the generated client to Worker.
type grpcClient struct {
	c pb.WorkerServiceClient
}

// Load calls the worker's Load.
func (c *grpcClient) Load(ctx context.Context, req *LoadRequest) (*LoadResponse, error) {
	resp, err := c.c.Load(ctx, toLoadRequest(req))
	if err != nil {
		return nil, errorOf(err)
	}
	return fromLoadResponse(resp), nil
}

// ErrNoResult is returned when a Run stream ends without a Result or Error event.
var ErrNoResult = errors.New("run stream ended without a result")

// Run calls the worker's Run and passes non-final events to emit.
func (c *grpcClient) Run(ctx context.Context, req *RunRequest, emit Emit) (*Result, error) {
	r, err := toRunRequest(req)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream if we return early
	stream, err := c.c.Run(ctx, r)
	if err != nil {
		return nil, errorOf(err)
	}
	for {
		ev, err := stream.Recv()
		if err == io.EOF {
			return nil, ErrNoResult
		}
		if err != nil {
			return nil, errorOf(err)
		}
		switch v := ev.GetEvent().(type) {
		case *pb.RunEvent_Result:
			return fromResult(v.Result), nil
		case *pb.RunEvent_Error:
			return nil, fromError(v.Error)
		}
		e, err := fromEvent(ev)
		if err != nil {
			return nil, err
		}
		if emit != nil {
			if err := emit(e); err != nil {
				return nil, fmt.Errorf("run: event handler: %w", err)
			}
		}
	}
}

// Stats calls the worker's Stats.
func (c *grpcClient) Stats(ctx context.Context) (*Stats, error) {
	resp, err := c.c.Stats(ctx, &pb.StatsRequest{})
	if err != nil {
		return nil, errorOf(err)
	}
	return fromStats(resp), nil
}

// Probe calls the worker's Probe.
func (c *grpcClient) Probe(ctx context.Context, req *ProbeRequest) (*ProbeResponse, error) {
	resp, err := c.c.Probe(ctx, toProbeRequest(req))
	if err != nil {
		return nil, errorOf(err)
	}
	return fromProbeResponse(resp), nil
}

// ErrNoEstimate is returned (wrapped) by Estimate when the worker does not estimate its memory.
var ErrNoEstimate = errors.New("the worker does not estimate its memory")

// Estimate calls the worker's Estimate.
func (c *grpcClient) Estimate(ctx context.Context, req *EstimateRequest) (*EstimateResponse, error) {
	resp, err := c.c.Estimate(ctx, toEstimateRequest(req))
	if status.Code(err) == codes.Unimplemented {
		return nil, fmt.Errorf("%w: %s", ErrNoEstimate, status.Convert(err).Message())
	}
	if err != nil {
		return nil, errorOf(err)
	}
	return fromEstimateResponse(resp), nil
}
