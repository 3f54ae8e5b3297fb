// Command probe is the throwaway worker that initialises a backend and lists its devices, so a
// driver that crashes while probing takes down only this process. It reports the "cpu" backend
// (GPU backends add their devices later) and can allocate, touch and free memory on request.
package main

import "github.com/framepackd/framepackd/internal/workerkit"

func main() {
	workerkit.Main("probe", func(k *workerkit.Kit) (workerkit.Worker, error) {
		return newProbe(k), nil
	})
}
