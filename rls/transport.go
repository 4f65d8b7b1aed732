package rls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// The bounds of the gRPC server, which whoever reaches the port can test.
// Envoy opens another connection when one has MaxConcurrentStreams calls
// under way, so the bound costs it nothing.
const (
	// MaxConcurrentStreams bounds the calls under way on one connection.
	MaxConcurrentStreams = 256
	// MaxRecvMsgSize bounds one call's message: 64 descriptors of a few
	// header values each fit many times over (gRPC's default is 4 MiB).
	MaxRecvMsgSize = 1 << 20
	// HandshakeTimeout bounds a connection's TLS handshake and HTTP/2
	// preface: a peer that opens connections and says nothing is cut off.
	HandshakeTimeout = 10 * time.Second
	// KeepaliveMinTime is the shortest interval between the pings a client
	// may send; a client that pings more often is disconnected.
	KeepaliveMinTime = 10 * time.Second
	// MaxConnectionIdle closes a connection with no call for this long
	// (with a GOAWAY: Envoy reconnects when it next needs one).
	MaxConnectionIdle = 15 * time.Minute
)

// ServerOptions are the options of a gRPC server that serves the rate
// limit service with creds: its transport security and its bounds.
func ServerOptions(creds *Credentials) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.Creds(creds),
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		grpc.ConnectionTimeout(HandshakeTimeout),
		// Envoy's connection_keepalive pings idle connections too.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: MaxConnectionIdle}),
	}
}

// TLSFiles are the PEM files of the listener's TLS, as the rls block's tls
// options name them.
type TLSFiles struct {
	// Cert is the server's certificate chain, leaf first.
	Cert string `json:"cert,omitempty"`
	// Key is Cert's private key.
	Key string `json:"key,omitempty"`
	// ClientCA, when set, makes the TLS mutual: a client must present a
	// certificate issued by one of these CAs, or the connection is refused.
	ClientCA string `json:"client_ca,omitempty"`
}

// Validate checks what can be checked without reading the files.
func (f *TLSFiles) Validate() error {
	switch {
	case f.Cert == "" && f.Key == "":
		return errors.New("tls: cert and key are required, e.g. tls { cert /etc/cascade/rls.crt; key /etc/cascade/rls.key }")
	case f.Cert == "":
		return errors.New("tls: key is set but cert is not: give both, cert <file> and key <file>")
	case f.Key == "":
		return errors.New("tls: cert is set but key is not: give both, cert <file> and key <file>")
	}
	return nil
}

// Config reads the files into a server's TLS configuration (TLS 1.2 at
// least; with ClientCA, a verified client certificate required). Each
// error names the option whose file is at fault.
func (f *TLSFiles) Config() (*tls.Config, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	certPEM, err := os.ReadFile(f.Cert)
	if err != nil {
		return nil, fmt.Errorf("tls cert: %w", err)
	}
	keyPEM, err := os.ReadFile(f.Key)
	if err != nil {
		return nil, fmt.Errorf("tls key: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("tls cert %s and key %s: %w", f.Cert, f.Key, err)
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{pair},
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2"}, // gRPC's clients require ALPN
	}
	if f.ClientCA != "" {
		caPEM, err := os.ReadFile(f.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("tls client_ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("tls client_ca %s: no PEM certificate in it", f.ClientCA)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// Credentials are a listener's transport security, which a configuration
// reload may change while it serves: plaintext until Set gives a TLS
// configuration. A connection keeps the security it was accepted with.
type Credentials struct {
	tls atomic.Pointer[tlsCreds]
}

type tlsCreds struct {
	credentials.TransportCredentials
}

var plaintext = insecure.NewCredentials()

// Set makes connections accepted from now on use cfg, or plaintext when
// cfg is nil.
func (c *Credentials) Set(cfg *tls.Config) {
	if cfg == nil {
		c.tls.Store(nil)
		return
	}
	c.tls.Store(&tlsCreds{credentials.NewTLS(cfg)})
}

// TLS says whether connections accepted now use TLS.
func (c *Credentials) TLS() bool { return c.tls.Load() != nil }

// ServerHandshake is credentials.TransportCredentials'.
func (c *Credentials) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if t := c.tls.Load(); t != nil {
		return t.ServerHandshake(conn)
	}
	return plaintext.ServerHandshake(conn)
}

// ClientHandshake is credentials.TransportCredentials': these are a
// server's.
func (c *Credentials) ClientHandshake(_ context.Context, _ string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("cascade rls: server credentials cannot dial")
}

// Info is credentials.TransportCredentials'.
func (c *Credentials) Info() credentials.ProtocolInfo {
	if t := c.tls.Load(); t != nil {
		return t.Info()
	}
	return plaintext.Info()
}

// Clone is credentials.TransportCredentials': the clone follows c.
func (c *Credentials) Clone() credentials.TransportCredentials { return c }

// OverrideServerName is credentials.TransportCredentials' (deprecated, and
// meaningless on a server).
func (c *Credentials) OverrideServerName(string) error { return nil }
