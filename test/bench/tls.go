package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// selfSignedCert writes a self-signed ECDSA P-256 certificate for
// 127.0.0.1 and its key into dir (cert.pem, key.pem; the key 0600): what
// a daemon started with --tls-cert serves, and what the benchmark's
// clients trust (clientTLS). P-256, as most deployments' certificates: the
// handshake each new connection pays is a real one's.
func selfSignedCert(dir string) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("TLS key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		Subject:      pkix.Name{CommonName: "phasegate bench"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", fmt.Errorf("TLS certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", fmt.Errorf("TLS key: %w", err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// clientTLS is a client configuration whose only root is the self-signed
// certificate in certFile (selfSignedCert). It sets no session cache, so
// that every connection makes a full handshake, as a checker that starts
// afresh for each check does; net/http offers ALPN http/1.1 with it and
// grpc-go h2.
func clientTLS(certFile string) (*tls.Config, error) {
	b, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", certFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// baseURL is the scheme and address of a daemon's port.
func baseURL(addr string, tlsCfg *tls.Config) string {
	if tlsCfg != nil {
		return "https://" + addr
	}
	return "http://" + addr
}

// transportCreds are gRPC's credentials for tlsCfg: plain text when nil.
func transportCreds(tlsCfg *tls.Config) credentials.TransportCredentials {
	if tlsCfg != nil {
		return credentials.NewTLS(tlsCfg)
	}
	return insecure.NewCredentials()
}
