package main

import (
	"errors"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// generate retries a lost connection, not a server that refuses jobs until it is ready.
func TestNotReadyIsNotALostConnection(t *testing.T) {
	refused, err := status.New(codes.Unavailable, "the server cannot run jobs now: loading").
		WithDetails(&errdetails.ErrorInfo{Reason: "NOT_READY", Domain: "framepackd"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{refused.Err(), true},
		{status.Error(codes.Unavailable, "error reading from server: EOF"), false},
		{status.Error(codes.Unavailable, "server is shutting down: jobs: queue stopped"), false},
		{errors.New("not a status"), false},
	} {
		if got := notReady(tc.err); got != tc.want {
			t.Errorf("notReady(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	id, err := newClientRequestID()
	if err != nil || len(id) != 32 {
		t.Fatalf("client request id %q %v", id, err)
	}
	if other, _ := newClientRequestID(); other == id {
		t.Fatalf("two client request ids are both %q", id)
	}
}
