package main

import (
	"errors"
	"image"
	"image/color"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// waitReady waits for the daemon's socket and a healthy answer.
var errExited = errors.New("framepackd exited before it was ready")

func waitReady(bin, sock string, exited <-chan struct{}) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errExited
		default:
		}
		if _, err := os.Stat(sock); err == nil {
			if exec.Command(filepath.Join(bin, "framepack"), "health", "--addr", sock, "--timeout", "5s").Run() == nil {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("framepackd not ready after 2 minutes")
}

func stopDaemon(d *exec.Cmd, exited <-chan struct{}) {
	_ = d.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		_ = d.Process.Kill()
		<-exited
	}
}

// writeImage writes a w × h gradient PNG (the job's start frame; its aspect picks the bucket).
func writeImage(path string, w, h int) error {
	im := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			im.Set(x, y, color.RGBA{uint8(255 * x / w), uint8(255 * y / h), uint8((x ^ y) & 255), 255})
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, im); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
