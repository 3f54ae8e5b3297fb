package main

// TLS and the bearer token for a framepackd --listen beyond loopback (--tls-cert, --tls-key,
// --token-file on the daemon). The CLI reads them from the environment so that every command
// takes them without new flags:
//
//	FRAMEPACK_TLS_CA      PEM file of the CA (or the self-signed certificate) to trust; set, TCP
//	                      connections use TLS
//	FRAMEPACK_TLS         "1": TLS with the system's roots
//	FRAMEPACK_TOKEN_FILE  file holding the bearer token sent on TCP connections

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/framepackd/framepackd/internal/apiaddr"
)

// transportOptions are the dial options for a: plain text on a unix socket, TLS and the token on
// TCP as the environment says.
func transportOptions(a apiaddr.Addr) ([]grpc.DialOption, error) {
	if a.Network != "tcp" {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	}
	var opts []grpc.DialOption
	secure := false
	switch ca := os.Getenv("FRAMEPACK_TLS_CA"); {
	case ca != "":
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("FRAMEPACK_TLS_CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("FRAMEPACK_TLS_CA %s: no PEM certificate in it", ca)
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})))
		secure = true
	case os.Getenv("FRAMEPACK_TLS") == "1":
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})))
		secure = true
	default:
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	if f := os.Getenv("FRAMEPACK_TOKEN_FILE"); f != "" {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("FRAMEPACK_TOKEN_FILE: %w", err)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: strings.TrimSpace(string(raw)), secure: secure}))
	}
	return opts, nil
}

// bearer sends "authorization: Bearer <token>" with every call.
type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity keeps the token off plain-text connections unless TLS is off on
// purpose (loopback).
func (b bearer) RequireTransportSecurity() bool { return b.secure }
