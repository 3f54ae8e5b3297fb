package workerkit

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/framepackd/framepackd/proto/gen/go/framepack/worker/v1"
)

// fill sets every field reachable from v to a non-zero value derived from seed, so a round trip
// that forgets a field shows up as a difference.
func fill(t *testing.T, v reflect.Value, seed *int) {
	t.Helper()
	*seed++
	n := *seed
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(n))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(n) + 0.5)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), seed)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			fill(t, v.Field(i), seed)
		}
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := 0; i < 2; i++ {
			fill(t, v.Index(i), seed)
		}
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(t, k, seed)
		fill(t, e, seed)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Interface:
		// Stage and Event are set by the caller.
	default:
		t.Fatalf("fill: unhandled kind %s", v.Kind())
	}
}

func filled[T any](t *testing.T, seed int) *T {
	var v T
	fill(t, reflect.ValueOf(&v).Elem(), &seed)
	return &v
}

// TestRoundTripEveryField sends every message type through the proto conversion and back.
func TestRoundTripEveryField(t *testing.T) {
	check := func(name string, in, out any) {
		t.Helper()
		if !reflect.DeepEqual(in, out) {
			t.Errorf("%s changed in a round trip:\n in  %+v\n out %+v", name, in, out)
		}
	}
	lr := filled[LoadRequest](t, 1)
	check("LoadRequest", lr, fromLoadRequest(toLoadRequest(lr)))
	lresp := filled[LoadResponse](t, 2)
	check("LoadResponse", lresp, fromLoadResponse(toLoadResponse(lresp)))
	pr := filled[ProbeRequest](t, 3)
	check("ProbeRequest", pr, fromProbeRequest(toProbeRequest(pr)))
	presp := filled[ProbeResponse](t, 4)
	check("ProbeResponse", presp, fromProbeResponse(toProbeResponse(presp)))
	st := filled[Stats](t, 5)
	check("Stats", st, fromStats(toStats(st)))
	res := filled[Result](t, 6)
	check("Result", res, fromResult(toResult(res)))
	e := filled[Error](t, 7)
	check("Error", e, fromError(toError(e)))

	stages := []Stage{
		filled[TextEncodeRequest](t, 10), filled[VAEEncodeRequest](t, 11), filled[VAEDecodeRequest](t, 12),
		filled[ImageEncodeRequest](t, 13), filled[TransformerSectionRequest](t, 14), filled[TransformerForwardRequest](t, 15),
	}
	for _, s := range stages {
		in := &RunRequest{JobID: "job", Stage: s}
		p, err := toRunRequest(in)
		if err != nil {
			t.Fatal(err)
		}
		out, err := fromRunRequest(p)
		if err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("RunRequest(%T)", s), in, out)
	}
	if _, err := toRunRequest(&RunRequest{}); CodeOf(err) != CodeInvalidArgument {
		t.Fatalf("run request without a stage: %v", err)
	}

	events := []Event{filled[Progress](t, 20), filled[StepPreview](t, 21), filled[ConvFallback](t, 22), filled[LogLine](t, 23)}
	for _, ev := range events {
		p, err := toEvent(ev)
		if err != nil {
			t.Fatal(err)
		}
		out, err := fromEvent(p)
		if err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("%T", ev), ev, out)
	}
}

func TestErrorStatusRoundTrip(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		wantCode ErrorCode
		wantGRPC codes.Code
		wantMsg  string
	}{
		{"oom", &Error{Code: CodeOutOfMemory, Message: "alloc", RequestedBytes: 8, AvailableBytes: 4,
			Traits: &ModelTraits{Convolves: true, Tiles: true, FallbackDTypes: []string{"fp16"}}}, CodeOutOfMemory, codes.ResourceExhausted, "alloc"},
		{"wrapped", fmt.Errorf("load vae: %w", Errorf(CodeDeviceLost, "hipErrorLaunchFailure")), CodeDeviceLost, codes.Unavailable, "load vae: hipErrorLaunchFailure"},
		{"plain", errors.New("boom"), CodeInternal, codes.Internal, "boom"},
		{"cancelled", fmt.Errorf("run: %w", context.Canceled), CodeCancelled, codes.Canceled, "run: context canceled"},
		{"bad input", Errorf(CodeInvalidArgument, "no stage"), CodeInvalidArgument, codes.InvalidArgument, "no stage"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := statusOf(tt.err)
			if status.Code(st) != tt.wantGRPC {
				t.Fatalf("grpc code %v, want %v", status.Code(st), tt.wantGRPC)
			}
			back := errorOf(st)
			var we *Error
			if !errors.As(back, &we) || we.Code != tt.wantCode || we.Message != tt.wantMsg {
				t.Fatalf("back: %#v", back)
			}
			if tt.wantCode == CodeOutOfMemory && (we.RequestedBytes != 8 || we.AvailableBytes != 4) {
				t.Fatalf("oom sizes lost: %+v", we)
			}
			if tr := TraitsOf(back); tt.wantCode == CodeOutOfMemory && (tr == nil || !tr.Tiles || !tr.Convolves || len(tr.FallbackDTypes) != 1) {
				t.Fatalf("oom traits lost: %+v", tr)
			}
		})
	}
	// A status without our detail keeps its meaning.
	if err := errorOf(status.Error(codes.DeadlineExceeded, "slow")); !errors.Is(err, context.DeadlineExceeded) || CodeOf(err) != CodeCancelled {
		t.Fatalf("deadline status: %v", err)
	}
	if CodeOf(nil) != CodeUnspecified || CodeOutOfMemory.String() != "out of memory" || ErrorCode(42).String() != "code(42)" {
		t.Fatal("code names")
	}
	// A request error keeps its code through wrapping and over the wire, with its whole message.
	bad := fmt.Errorf("vae_decode: %w", InvalidArgumentf("latents: shape %v", []int64{1, 2}))
	if CodeOf(bad) != CodeInvalidArgument || !errors.Is(bad, ErrInvalidArgument) {
		t.Fatalf("request error: %v", CodeOf(bad))
	}
	if we := errorOf(statusOf(bad)).(*Error); we.Code != CodeInvalidArgument || we.Message != "vae_decode: invalid argument: latents: shape [1 2]" {
		t.Fatalf("request error over the wire: %+v", we)
	}
}

func TestExitStatusString(t *testing.T) {
	tests := []struct {
		st   ExitStatus
		want string
		ok   bool
	}{
		{ExitStatus{Code: 0}, "exit status 0", true},
		{ExitStatus{Code: 2}, "exit status 2", false},
		{ExitStatus{Code: -1, Signal: 9, Killed: true}, "signal: killed (killed by supervisor)", false},
		{ExitStatus{Code: -1, Err: errors.New("x")}, "wait: x", false},
	}
	for _, tt := range tests {
		if got := tt.st.String(); got != tt.want || tt.st.Success() != tt.ok {
			t.Errorf("%+v: %q, %v; want %q, %v", tt.st, got, tt.st.Success(), tt.want, tt.ok)
		}
	}
}

// fillProto is fill for generated messages: unexported fields (protoimpl state) are skipped.
func fillProto(t *testing.T, v reflect.Value, seed *int) {
	t.Helper()
	if v.Kind() == reflect.Struct {
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				fillProto(t, v.Field(i), seed)
			}
		}
		return
	}
	if v.Kind() == reflect.Pointer && v.Type().Elem().Kind() == reflect.Struct {
		v.Set(reflect.New(v.Type().Elem()))
		fillProto(t, v.Elem(), seed)
		return
	}
	if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Pointer {
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := 0; i < 2; i++ {
			fillProto(t, v.Index(i), seed)
		}
		return
	}
	fill(t, v, seed)
}

func filledProto[T any](t *testing.T, seed int) *T {
	var v T
	fillProto(t, reflect.ValueOf(&v).Elem(), &seed)
	return &v
}

// TestProtoRoundTripEveryField goes the other way: every field of the generated messages must
// survive proto → Go → proto, so a proto field without a Go counterpart shows up.
func TestProtoRoundTripEveryField(t *testing.T) {
	check := func(name string, in, out proto.Message) {
		t.Helper()
		if !proto.Equal(in, out) {
			t.Errorf("%s changed in a round trip:\n in  %v\n out %v", name, in, out)
		}
	}
	lr := filledProto[pb.LoadRequest](t, 1)
	check("LoadRequest", lr, toLoadRequest(fromLoadRequest(lr)))
	lresp := filledProto[pb.LoadResponse](t, 2)
	check("LoadResponse", lresp, toLoadResponse(fromLoadResponse(lresp)))
	pr := filledProto[pb.ProbeRequest](t, 3)
	check("ProbeRequest", pr, toProbeRequest(fromProbeRequest(pr)))
	presp := filledProto[pb.ProbeResponse](t, 4)
	check("ProbeResponse", presp, toProbeResponse(fromProbeResponse(presp)))
	st := filledProto[pb.StatsResponse](t, 5)
	check("StatsResponse", st, toStats(fromStats(st)))
	res := filledProto[pb.Result](t, 6)
	check("Result", res, toResult(fromResult(res)))
	e := filledProto[pb.Error](t, 7)
	check("Error", e, toError(fromError(e)))

	stages := []*pb.RunRequest{
		{JobId: "j", Stage: &pb.RunRequest_TextEncode{TextEncode: filledProto[pb.TextEncodeRequest](t, 10)}},
		{JobId: "j", Stage: &pb.RunRequest_VaeEncode{VaeEncode: filledProto[pb.VaeEncodeRequest](t, 11)}},
		{JobId: "j", Stage: &pb.RunRequest_VaeDecode{VaeDecode: filledProto[pb.VaeDecodeRequest](t, 12)}},
		{JobId: "j", Stage: &pb.RunRequest_ImageEncode{ImageEncode: filledProto[pb.ImageEncodeRequest](t, 13)}},
		{JobId: "j", Stage: &pb.RunRequest_TransformerSection{TransformerSection: filledProto[pb.TransformerSectionRequest](t, 14)}},
		{JobId: "j", Stage: &pb.RunRequest_TransformerForward{TransformerForward: filledProto[pb.TransformerForwardRequest](t, 15)}},
	}
	// Every stage of the oneof is covered, so a new stage cannot miss its conversion.
	if n := (&pb.RunRequest{}).ProtoReflect().Descriptor().Oneofs().ByName("stage").Fields().Len(); n != len(stages) {
		t.Fatalf("RunRequest.stage has %d cases, the test covers %d", n, len(stages))
	}
	for _, in := range stages {
		g, err := fromRunRequest(in)
		if err != nil {
			t.Fatal(err)
		}
		out, err := toRunRequest(g)
		if err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("RunRequest(%T)", in.Stage), in, out)
	}
	events := []*pb.RunEvent{
		{Event: &pb.RunEvent_Progress{Progress: filledProto[pb.Progress](t, 20)}},
		{Event: &pb.RunEvent_StepPreview{StepPreview: filledProto[pb.StepPreview](t, 21)}},
		{Event: &pb.RunEvent_ConvFallback{ConvFallback: filledProto[pb.ConvFallback](t, 22)}},
		{Event: &pb.RunEvent_Log{Log: filledProto[pb.LogLine](t, 23)}},
	}
	for _, in := range events {
		g, err := fromEvent(in)
		if err != nil {
			t.Fatal(err)
		}
		out, err := toEvent(g)
		if err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("%T", in.Event), in, out)
	}
}
