// Package envconfig is the one registry of the environment variables framepackd reads, each
// with its doc, as Ollama's envconfig is: the only Go file that names them. Settings that
// change what a worker computes are not here but fields of its LoadRequest (activation dtype,
// conv policy, attention tier, staged upload, SigLIP processor) or of the native backend's
// config (the cuDNN Find database); what stays a variable is the client's address and
// credentials, where the daemon finds its backend libraries, what the supervisor hands a worker
// process it starts, and the knobs tests, the GPU check and benchmarks turn (a knob that sets a
// worker setting only fills in a field its request left unset). The native backend reads its
// own knobs in one file (native/gpu/fpk_gpu_settings.cu); they are declared here too, so one
// list documents them all (framepackd --help, TestEveryVariableDeclared).
package envconfig

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// Scope says who reads a variable.
type Scope string

// Scopes, in the order Usage lists them.
const (
	// Client variables are read by the framepack CLI.
	Client Scope = "client"
	// Daemon variables configure framepackd and the workers it starts (they inherit its
	// environment).
	Daemon Scope = "daemon"
	// Handoff variables are set by the supervisor for a worker process it starts.
	Handoff Scope = "handoff"
	// Test variables are knobs of tests, the GPU check and benchmarks.
	Test Scope = "test"
	// Internal variables are how tests talk to the processes they start (a test binary re-run
	// as a daemon or a helper, a fault's ledger); nobody sets them by hand.
	Internal Scope = "internal"
	// Native variables are read by the GPU backend library (native/gpu/fpk_gpu_settings.cu):
	// benchmark and test knobs of the kernels and vendor libraries.
	Native Scope = "native"
)

// Var is one environment variable: its name, who reads it and what it does.
type Var struct {
	Name  string
	Scope Scope
	Doc   string
}

// Get returns the variable's value ("" when unset).
func (v Var) Get() string { return os.Getenv(v.Name) }

// Lookup returns the variable's value and whether it is set.
func (v Var) Lookup() (string, bool) { return os.LookupEnv(v.Name) }

// On reports whether the variable is "1".
func (v Var) On() bool { return v.Get() == "1" }

// String returns the variable's name.
func (v Var) String() string { return v.Name }

var all []Var

func declare(name string, scope Scope, doc string) Var {
	v := Var{Name: name, Scope: scope, Doc: doc}
	all = append(all, v)
	return v
}

// The client's variables (cmd/framepack).
var (
	Addr = declare("FRAMEPACK_ADDR", Client,
		"the server address when --addr is not given: a socket path, unix:///path, or tcp://host:port")
	TLSCA = declare("FRAMEPACK_TLS_CA", Client,
		"PEM file of the CA (or the self-signed certificate) to trust; set, TCP connections use TLS")
	TLS = declare("FRAMEPACK_TLS", Client,
		`"1": TLS on TCP connections with the system's roots`)
	TokenFile = declare("FRAMEPACK_TOKEN_FILE", Client,
		"file holding the bearer token sent on TCP connections")
)

// The daemon's variables.
var (
	NativeDir = declare("FRAMEPACK_NATIVE_DIR", Daemon,
		"directory of the GPU backend libraries (libfpk-cuda.so, libfpk-hip.so); default: next to the executable")
	CUDARoot = declare("FRAMEPACK_CUDA_ROOT", Native,
		"root of the CUDA libraries the cuda backend opens (before CUDA_HOME, CUDA_PATH, /usr/local/cuda)")
	ROCmRoot = declare("FRAMEPACK_ROCM_ROOT", Native,
		"root of the ROCm libraries the hip backend opens (before ROCM_PATH, /opt/rocm)")
)

// What the supervisor hands a worker process (workerkit.Start, workerkit.Serve).
var (
	BeaconFD = declare("FRAMEPACK_BEACON_FD", Handoff,
		"file descriptor of the beacon page the worker inherits")
	ParentPID = declare("FRAMEPACK_PARENT_PID", Handoff,
		"the supervisor's pid; the worker exits when its parent is another")
	LogLevel = declare("FRAMEPACK_LOG_LEVEL", Handoff,
		"the worker's log level (logrus names; default info)")
)

// Knobs of tests, the GPU check and benchmarks. Those that set a worker setting only fill in
// what a LoadRequest or the runtime's Options left unset.
var (
	Backend = declare("FRAMEPACK_BACKEND", Test,
		`the runtime's backend when none is named ("cpu", "cuda", "hip", "auto"; default cpu): tests run on a GPU with it`)
	ActivationDType = declare("FRAMEPACK_ACTIVATION_DTYPE", Test,
		`the activation dtype of a model whose LoadRequest names none ("f32", "bf16", "fp16"): the f32 parity runs on a GPU`)
	ConvTier = declare("FRAMEPACK_CONV_TIER", Test,
		`the one conv tier a runtime without a conv policy tries ("vendor_tuned", "vendor_default", "own_kernel", "cpu")`)
	AttentionTier = declare("FRAMEPACK_ATTENTION_TIER", Test,
		`the one attention tier a runtime tries when none is named ("vendor", "flash", "chunked", "cpu")`)
	StagedUpload = declare("FRAMEPACK_STAGED_UPLOAD", Test,
		"staged upload of resident weights when the LoadRequest leaves it to the backend (a bool; default: on a device backend)")
	StagedUploadSlotBytes = declare("FRAMEPACK_STAGED_UPLOAD_SLOT_BYTES", Test,
		"the size of each staging slot when the LoadRequest names none (default 128 MiB)")
	Fixtures = declare("FRAMEPACK_FIXTURES", Test,
		"the parity fixture set (default testdata/parity)")
	ReferenceFixtures = declare("FRAMEPACK_REFERENCE_FIXTURES", Test,
		"the project's own reference fixtures (default testdata/reference)")
	TestLog = declare("FRAMEPACK_TEST_LOG", Test,
		"set: test daemons log at debug level")
	FakeGPUVersions = declare("FRAMEPACK_TEST_FAKE_GPU_VERSIONS", Test,
		`fakes the GPU runtime and driver versions the probe reports ("<cuda|hip>:<runtime>/<driver>")`)
	FakeVRAMDir = declare("FRAMEPACK_FAKE_VRAM_DIR", Internal,
		"directory of the fake device-memory ledger workers write for Fault.hold_vram_bytes")
	IgnoreSIGTERM = declare("FRAMEPACK_TEST_IGNORE_SIGTERM", Internal,
		`"1": the worker ignores SIGTERM (tests of the supervisor's SIGKILL)`)
	VendorAttention = declare("FRAMEPACK_TEST_VENDOR_ATTENTION", Test,
		`"1": the attention tests require the vendor tier to serve`)
	ShmTestParent = declare("FRAMEPACK_SHM_TEST_PARENT", Test,
		"moves the shared-memory roots of tests from /dev/shm into this directory")
	ShmTestHelper = declare("FRAMEPACK_SHM_TEST_HELPER", Internal,
		"marks the shm tests' helper process")
	PipelineTestDaemon = declare("FRAMEPACK_PIPELINE_TEST_DAEMON", Internal,
		"turns the pipeline test binary into a daemon process (its options as JSON)")
	WatchdogTestDaemon = declare("FRAMEPACK_WATCHDOG_TEST_DAEMON", Internal,
		"turns the watchdog test binary into a daemon process")
	LanesTestWorker = declare("FRAMEPACK_LANES_TEST_WORKER", Internal,
		"turns the lanes test binary into a fake worker")
	WorkerkitTestHelper = declare("FRAMEPACK_WORKERKIT_TEST_HELPER", Internal,
		"turns the workerkit test binary into a test worker")
	TestbinChild = declare("FRAMEPACK_TESTBIN_CHILD", Internal,
		"marks testbin's child process")
	ProbeTestEnv = declare("FRAMEPACK_PROBE_TEST_ENV", Internal,
		"a variable the probe test passes through ProbeRequest.env")
	DevicesTestAlloc = declare("FRAMEPACK_DEVICES_TEST_ALLOC", Internal,
		"bytes the device tests' helper process allocates")
)

// The GPU backend's knobs (native/gpu/fpk_gpu_settings.cu reads them once per backend; the
// VAE's memory estimate reads the sizes here as the backend does).
var (
	GPUNoBLAS = declare("FRAMEPACK_GPU_NO_BLAS", Native,
		`"1": the own GEMM kernel even where the vendor BLAS loaded`)
	GPUNoBLASLib = declare("FRAMEPACK_GPU_NO_BLAS_LIB", Native,
		`"1": the vendor BLAS is not opened`)
	GPUNoBLASLt = declare("FRAMEPACK_GPU_NO_BLASLT", Native,
		`"1": cuBLASLt is not opened (bias and GELU then run as separate ops)`)
	GPUNoDNN = declare("FRAMEPACK_GPU_NO_DNN", Native,
		`"1": the vendor DNN library (cuDNN, MIOpen) is not opened: no vendor conv or attention tiers`)
	CUDNNWorkspaceMB = declare("FRAMEPACK_CUDNN_WORKSPACE_MB", Native,
		"most MiB of workspace a cuDNN NCDHW convolution may take (default 8192)")
	CUDNNNHWCWorkspaceMB = declare("FRAMEPACK_CUDNN_NHWC_WORKSPACE_MB", Native,
		"most MiB of workspace a channels-last cuDNN convolution may take (default 256)")
	CUDNNSlabMB = declare("FRAMEPACK_CUDNN_SLAB_MB", Native,
		"most MiB of one channels-last slab of a convolution (default 1024)")
	CUDNNLayout = declare("FRAMEPACK_CUDNN_LAYOUT", Native,
		`"ncdhw": cuDNN convolutions in NCDHW instead of channels-last`)
	GPUConvFMA = declare("FRAMEPACK_GPU_CONV_FMA", Native,
		`"1": the own conv tier runs its FMA kernel, not the matrix-unit one`)
	GPUConvSelfcheck = declare("FRAMEPACK_GPU_CONV_SELFCHECK", Native,
		`"strict": a matrix-unit conv path that fails its self-check fails the call with the reason`)
	GPUConvMMAWarps = declare("FRAMEPACK_GPU_CONV_MMA_WARPS", Native,
		"warps of the matrix-unit conv kernel: 4 (blocks of 64 × 64, default) or 8 (64 × 32)")
	GPUConvMMAStages = declare("FRAMEPACK_GPU_CONV_MMA_STAGES", Native,
		"pipeline stages of the matrix-unit conv kernel: 2, 3 (default) or 4")
	GPUAttentionMiB = declare("FRAMEPACK_GPU_ATTENTION_MIB", Native,
		"most MiB of attention scores the chunked attention holds (default 1024)")
	GPUFlashFMA = declare("FRAMEPACK_GPU_FLASH_FMA", Native,
		`"1": the flash attention runs its FMA kernel, not the matrix-unit ones`)
	GPUFlashSelfcheck = declare("FRAMEPACK_GPU_FLASH_SELFCHECK", Native,
		`"strict": a matrix-unit attention path that fails its self-check fails the call with the reason`)
	GPUFlashWarps = declare("FRAMEPACK_GPU_FLASH_WARPS", Native,
		"warps of the matrix-unit flash kernel for head dim 128: 4 or 8 (default)")
	GPUFlashStages = declare("FRAMEPACK_GPU_FLASH_STAGES", Native,
		"pipeline stages of the matrix-unit flash kernel for head dim 128: 1 or 2 (default)")
)

// Vars returns every declared variable, by name.
func Vars() []Var {
	out := slices.Clone(all)
	slices.SortFunc(out, func(a, b Var) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Lookup returns the declared variable called name.
func Lookup(name string) (Var, bool) {
	for _, v := range all {
		if v.Name == name {
			return v, true
		}
	}
	return Var{}, false
}

// Usage writes the variables of scopes (every scope when none is given), by scope then name,
// each with its doc: the environment section of a --help.
func Usage(w io.Writer, scopes ...Scope) {
	if len(scopes) == 0 {
		scopes = []Scope{Client, Daemon, Handoff, Test, Native, Internal}
	}
	vars := Vars()
	for _, s := range scopes {
		first := true
		for _, v := range vars {
			if v.Scope != s {
				continue
			}
			if first {
				fmt.Fprintf(w, "environment (%s):\n", s)
				first = false
			}
			fmt.Fprintf(w, "  %s\n    \t%s\n", v.Name, v.Doc)
		}
	}
}
