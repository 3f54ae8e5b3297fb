package main

import (
	"github.com/framepackd/framepackd/internal/gpuversion"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// readVersions is gpuversion.Read; tests replace it.
var readVersions = gpuversion.Read

// runtimeVersions adds the GPU runtime's and the host driver's versions of backend to resp
// (none on the cpu, unless gpuversion.EnvFake fakes a pair for a test). The supervisor judges
// the pair (gpuversion.Check) and holds the lanes a mismatch would crash.
func runtimeVersions(backend string, resp *workerkit.ProbeResponse) error {
	v, ok, err := readVersions(backend, gpuversion.Options{})
	if err != nil {
		return workerkit.Errorf(workerkit.CodeInvalidArgument, "probe: runtime versions: %v", err)
	}
	if !ok {
		return nil
	}
	resp.Runtime = &workerkit.RuntimeVersions{Backend: v.Backend, RuntimeVersion: v.Runtime.String(), DriverVersion: v.Driver.String(),
		RuntimeSource: v.RuntimeSource, DriverSource: v.DriverSource}
	return nil
}
