package apiauth

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// ServerTLS is the TLS configuration of an agent's listener: the
// certificate and key of agent.tls_cert_file and agent.tls_key_file, TLS
// 1.2 at least. The key must be mode 0600 or stricter; an expired
// certificate is refused.
func ServerTLS(certFile, keyFile string, now time.Time) (*tls.Config, error) {
	fi, err := os.Stat(keyFile)
	if err != nil {
		return nil, fmt.Errorf("agent.tls_key_file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("agent.tls_key_file %s is readable by others (mode %o): chmod 600 it: %w", keyFile, fi.Mode().Perm(), layering.ErrInvalid)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("agent.tls_cert_file %s and agent.tls_key_file %s: %w: give a PEM certificate and its PEM private key: %w",
			certFile, keyFile, err, layering.ErrInvalid)
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("agent.tls_cert_file %s: %w: %w", certFile, err, layering.ErrInvalid)
		}
	}
	if now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("agent.tls_cert_file %s expired on %s: give a current certificate: %w",
			certFile, leaf.NotAfter.UTC().Format(time.RFC3339), layering.ErrInvalid)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}, nil
}

// ClientTLS is the TLS configuration of a caller of agents: their
// certificates are verified against the PEM certificates of caFile
// (agent.ca_file, FOGDEPLOY_CA_FILE), else against the system's roots.
func ClientTLS(caFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile == "" {
		return cfg, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("agent.ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("agent.ca_file %s holds no PEM certificate: give the CA (or the certificate) that signed the agents' certificates: %w",
			caFile, layering.ErrInvalid)
	}
	cfg.RootCAs = pool
	return cfg, nil
}
