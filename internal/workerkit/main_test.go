package workerkit_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/testbin"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// helperEnv turns the test binary into another process: "fake-worker" serves fakeWorker,
// "supervisor <probe> <socket dir>" starts the probe worker, prints its pid and waits to be killed.
const helperEnv = "FRAMEPACK_WORKERKIT_TEST_HELPER"

func TestMain(m *testing.M) {
	if v := os.Getenv(helperEnv); v != "" {
		os.Exit(helper(strings.Fields(v)))
	}
	code := m.Run()
	testbin.Cleanup()
	if left, err := shmtest.Leftovers(); err != nil || len(left) > 0 {
		fmt.Fprintf(os.Stderr, "shared-memory leftovers: %v %v\n", left, err)
		code = 1
	}
	os.Exit(code)
}

func helper(args []string) int {
	switch {
	case len(args) == 1 && args[0] == "fake-worker":
		workerkit.Main("fake", func(k *workerkit.Kit) (workerkit.Worker, error) {
			return &fakeWorker{k: k}, nil
		})
	case len(args) == 3 && args[0] == "supervisor":
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		log := logrus.New()
		log.SetOutput(os.Stderr)
		p, err := workerkit.Start(ctx, workerkit.Config{Name: "probe", Path: args[1], SocketDir: args[2], Log: logrus.NewEntry(log)})
		if err != nil {
			fmt.Fprintln(os.Stderr, "start:", err)
			return 1
		}
		fmt.Println(p.PID())
		time.Sleep(time.Minute) // until the test kills us
		return 0
	}
	fmt.Fprintf(os.Stderr, "bad helper args %q\n", args)
	return 2
}

// fakeWorker is a model worker whose behaviour the prompt of a text-encode stage chooses.
type fakeWorker struct {
	k *workerkit.Kit
}

func (w *fakeWorker) Load(_ context.Context, req *workerkit.LoadRequest) (*workerkit.LoadResponse, error) {
	switch req.ModelDir {
	case "":
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "load: model_dir is required")
	case "panic":
		var m map[string]int
		m["load"]++ // a bug: assignment to a nil map
	}
	return &workerkit.LoadResponse{Backend: "cpu", DType: "fp32", WeightBytes: 1234, Device: &workerkit.Device{Name: "fake"}}, nil
}

func (w *fakeWorker) Run(ctx context.Context, req *workerkit.RunRequest, emit workerkit.Emit) (*workerkit.Result, error) {
	te, ok := req.Stage.(*workerkit.TextEncodeRequest)
	if !ok {
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "fake worker runs text_encode only, got %T", req.Stage)
	}
	switch te.Prompt {
	case "oom":
		return nil, fmt.Errorf("encode llama: %w", &workerkit.Error{Code: workerkit.CodeOutOfMemory, Message: "allocate 4096 bytes", RequestedBytes: 4096, AvailableBytes: 1024})
	case "crash":
		w.k.Log.Error("fake fatal condition: device on fire")
		fmt.Fprintln(os.Stderr, "just a chatty line")
		os.Exit(3)
	case "panic":
		panic("fake bug in run")
	case "hang":
		w.k.Beacon.BeginOp("conv3d.hang")
		<-ctx.Done()
		select {} // like a stuck driver call: ignores cancellation
	}
	for i := uint32(1); i <= 3; i++ {
		w.k.Beacon.BeginOp(fmt.Sprintf("step-%d", i))
		w.k.Beacon.SetStep(int(i), 3)
		if err := emit(&workerkit.Progress{Phase: "encode_llama", Step: i, TotalSteps: 3, Elapsed: time.Duration(i) * time.Millisecond}); err != nil {
			return nil, err
		}
		w.k.Beacon.EndOp()
	}
	if err := emit(&workerkit.LogLine{Level: workerkit.LogWarn, Message: "prompt truncated", Fields: map[string]string{"tokens": "300"}}); err != nil {
		return nil, err
	}
	out := te.LlamaVec
	out.DType, out.Shape = "F32", []int64{1, 512, 4096}
	return &workerkit.Result{Outputs: []workerkit.TensorRef{out}, Stats: &workerkit.Stats{OpCounts: map[string]uint64{"gemm": 3}}}, nil
}

func (w *fakeWorker) Stats(context.Context) (*workerkit.Stats, error) {
	return &workerkit.Stats{HostRSSBytes: 1}, nil
}
